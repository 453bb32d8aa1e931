"""``openai``: a success judge served by any OpenAI-compatible chat endpoint that takes images (vLLM, SGLang, ...).

Each sample becomes one chat completion: the instruction, then the sample's
images as ``data:image/png;base64`` parts (the end frames, the start and end
frames, or the whole clip: option ``inputs``), asking for a JSON answer
``{"success": true|false, "confidence": 0..1}``. A reply that cannot be read
becomes an error for that sample (a rerun of ``judge`` asks again), never a
guess.

The API key comes from an environment variable (``api_key=env:OPENAI_API_KEY``,
the default), read in the process that sends; predictions and their sidecar
hold the reference, never the key. Requests go only to ``base_url``, which
comes from the command line. Standard library only (``urllib``).
"""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Sequence

from robocasa_shift.errors import BadInput, PolicyServerError
from robocasa_shift.judging.judges import Judge, Verdict
from robocasa_shift.judging.judgeset import INPUTS, JudgeSample

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
SYSTEM_PROMPT = ("You judge whether a robot manipulation attempt succeeded. You are given the task instruction and "
                 "camera images of the attempt, in time order; the last image of each camera is the final state. "
                 'Answer with JSON only: {"success": true or false, "confidence": a number from 0 to 1 that the '
                 "task succeeded}.")
_JSON_OBJECT = re.compile(r"\{[^{}]*\}", re.DOTALL)


def parse_answer(text: str) -> Optional[Verdict]:
    """A verdict from a reply: the first JSON object with a boolean ``success``; else None (unreadable)."""
    for match in _JSON_OBJECT.finditer(text or ""):
        try:
            answer = json.loads(match.group(0))
        except ValueError:
            continue
        if isinstance(answer.get("success"), bool):
            conf = answer.get("confidence")
            conf = float(conf) if isinstance(conf, (int, float)) and 0.0 <= float(conf) <= 1.0 else None
            return Verdict(answer["success"], conf)
    return None


class OpenAIJudge(Judge):
    """A VLM judge behind an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        model: the served model's name.
        base_url: the endpoint's base (``.../v1``).
        api_key: the key, given as ``env:NAME`` (read here from the environment).
        inputs: ``end``, ``start_end`` or ``clip``.
        timeout_s: per request.
        max_tokens: of each answer.
    """

    name = "openai"

    def __init__(self, model: str = "default", base_url: str = DEFAULT_BASE_URL, api_key: str = "env:OPENAI_API_KEY",
                 inputs: str = "start_end", timeout_s: float = 120.0, max_tokens: int = 64):
        from robocasa_shift.policies import resolve_secret_options

        if inputs not in INPUTS:
            raise BadInput(f"judge option inputs={inputs!r}: one of {', '.join(INPUTS)}")
        if not base_url.startswith(("http://", "https://")):
            raise BadInput(f"judge option base_url={base_url!r}: an http(s) URL such as {DEFAULT_BASE_URL}")
        self.model, self.base_url, self.inputs = model, base_url.rstrip("/"), inputs
        self.timeout_s, self.max_tokens = float(timeout_s), int(max_tokens)
        self._key = resolve_secret_options({"api_key": api_key})["api_key"]

    def request_body(self, sample: JudgeSample) -> Dict[str, Any]:
        """The chat-completion request for one sample."""
        content: List[Dict[str, Any]] = [{"type": "text", "text": f"Task instruction: {sample.instruction}"}]
        for camera, role in sample.cameras.items():
            if self.inputs == "clip":
                images = sample.images["clip"][camera]
            elif self.inputs == "start_end":
                images = [sample.images["start"][camera], sample.images["end"][camera]]
            else:
                images = [sample.images["end"][camera]]
            content.append({"type": "text", "text": f"Camera {camera} ({role.replace('_', '-')}):"})
            content += [{"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                                   + base64.b64encode(data).decode()}}
                        for data in images]
        return {"model": self.model, "temperature": 0, "max_tokens": self.max_tokens,
                "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": content}]}

    def _ask(self, body: Dict[str, Any]) -> str:
        request = urllib.request.Request(
            f"{self.base_url}/chat/completions", data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self._key}"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                reply = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise PolicyServerError(f"judge endpoint {self.base_url} answered HTTP {exc.code} ({exc.reason})") from None
        except (urllib.error.URLError, OSError) as exc:
            raise PolicyServerError(f"judge endpoint {self.base_url} unreachable: {exc}") from None
        except ValueError:
            raise PolicyServerError(f"judge endpoint {self.base_url} answered something that is not JSON") from None
        try:
            return reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise PolicyServerError(f"judge endpoint {self.base_url} answered without choices[0].message.content")

    def judge(self, samples: Sequence[JudgeSample]) -> List[Verdict]:
        verdicts = []
        for sample in samples:
            text = self._ask(self.request_body(sample))
            verdict = parse_answer(text)
            verdicts.append(verdict or Verdict(False, None, error=f"unreadable answer: {text[:120]!r}"))
        return verdicts

    def identity(self) -> Dict[str, Any]:
        return {"name": self.name, "model": self.model, "base_url": self.base_url, "inputs": self.inputs}


__all__ = ["OpenAIJudge", "parse_answer"]
