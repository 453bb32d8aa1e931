"""``openai``: a success judge served by any OpenAI-compatible chat endpoint that takes images (vLLM, SGLang, ...).

Each sample becomes one chat completion: the instruction, then the sample's
images as ``data:image/png;base64`` parts (the end frames, the start and end
frames, or the whole clip: option ``inputs``; ``inputs=video`` sends each
camera's MP4 as a ``video_url`` part instead), asking for a JSON answer
``{"success": true|false, "confidence": 0..1}``. A reply that cannot be read
becomes an error for that sample (a rerun of ``judge`` asks again), never a
guess.

The system prompt is a template file (``prompt_file``; the default,
``judging/prompts/openai.txt``, ships with the package), whose SHA-256 the
predictions' sidecar records. ``thinking_budget=N`` asks a reasoning model to
think (``chat_template_kwargs.enable_thinking``, as vLLM and SGLang serve
Qwen3 and Gemma) with N more tokens of ``max_tokens``; ``reasoning_effort`` is
passed through as OpenAI's field. The judge's reasoning (the reply's
``reasoning_content`` or ``reasoning``, a ``<think>`` block, or the text around
its JSON answer) is kept in the predictions' ``reasoning`` column.

The API key comes from an environment variable (``api_key=env:OPENAI_API_KEY``,
the default), read in the process that sends; predictions and their sidecar
hold the reference, never the key. Requests go only to ``base_url``, which
comes from the command line: redirects are never followed (a 3xx is an error
for that sample, and the key is never sent anywhere else), and a ``base_url``
holding credentials (``http://user:KEY@host``) or a query is refused.

A server is not trusted to behave: each request has a total deadline
(``timeout_s``, connecting, sending and reading the whole reply together, so
a reply dripped byte by byte ends at the deadline), a reply over
``max_reply_bytes`` is refused, and a failed request (HTTP 500, a 3xx, a reply
that is not JSON or has no text content, a timeout) becomes an error verdict
for that sample (a rerun of ``judge`` asks again). The judge stops, with the
last error, after ``max_consecutive_failures`` failed requests in a row, or at
once on HTTP 401/403 (a wrong key fails every sample). Standard library only
(``http.client``; no proxy is used).
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import hashlib
import socket
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from robocasa_shift.config import is_secret_option
from robocasa_shift.errors import BadInput, PolicyServerError, PolicyServerTimeout
from robocasa_shift.judging.judges import Judge, Verdict
from robocasa_shift.judging.judgeset import INPUTS, JudgeSample

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
SYSTEM_PROMPT = ("You judge whether a robot manipulation attempt succeeded. You are given the task instruction and "
                 "camera images of the attempt, in time order; the last image of each camera is the final state. "
                 'Answer with JSON only: {"success": true or false, "confidence": a number from 0 to 1 that the '
                 "task succeeded}.")
PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
DEFAULT_PROMPT_FILE = PROMPTS_DIR / "openai.txt"  # holds SYSTEM_PROMPT
MAX_PROMPT_BYTES = 64 * 1024
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)
_JSON_OBJECT = re.compile(r"\{[^{}]*\}", re.DOTALL)
DEFAULT_MAX_REPLY_BYTES = 4 * 2**20  # a chat completion of a few tokens is a few kB
DEFAULT_MAX_CONSECUTIVE_FAILURES = 5


def check_base_url(base_url: str) -> Any:
    """``base_url`` split, or :class:`BadInput`: an http(s) URL with a host, without credentials or a query."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise BadInput(f"judge option base_url={base_url!r}: an http(s) URL such as {DEFAULT_BASE_URL}")
    parts = urlsplit(base_url)
    try:
        parts.port
    except ValueError:
        raise BadInput(f"judge option base_url: the port of {parts.scheme}://{parts.hostname}... is not a number") from None
    if "@" in parts.netloc:
        raise BadInput("judge option base_url holds credentials (user:password@): they would be sent in clear and "
                       "written with the predictions; give the key as api_key=env:NAME instead")
    if parts.query or parts.fragment:
        secret = any(is_secret_option(pair.partition("=")[0]) for pair in parts.query.split("&"))
        raise BadInput(f"judge option base_url has a {'secret-named ' if secret else ''}query or fragment; give the "
                       f"endpoint as scheme://host[:port]/path (a key goes in api_key=env:NAME)")
    if not parts.hostname:
        raise BadInput(f"judge option base_url={base_url!r}: no host")
    return parts


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
        inputs: ``end``, ``start_end``, ``clip`` or ``video``.
        prompt_file: the system prompt's template file (default: the package's ``prompts/openai.txt``).
        thinking_budget: tokens a reasoning model may think with (0: thinking not asked for).
        reasoning_effort: OpenAI's ``reasoning_effort`` (``low``, ``medium``, ``high``), when given.
        timeout_s: per request, in all (connect, send, the whole reply).
        max_tokens: of each answer.
        max_reply_bytes: a longer reply is refused (an error for that sample).
        max_consecutive_failures: stop after this many failed requests in a row.
    """

    name = "openai"

    def __init__(self, model: str = "default", base_url: str = DEFAULT_BASE_URL, api_key: str = "env:OPENAI_API_KEY",
                 inputs: str = "start_end", timeout_s: float = 120.0, max_tokens: int = 64,
                 max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
                 max_consecutive_failures: int = DEFAULT_MAX_CONSECUTIVE_FAILURES,
                 prompt_file: Optional[str] = None, thinking_budget: int = 0,
                 reasoning_effort: Optional[str] = None):
        from robocasa_shift.policies import resolve_secret_options

        if inputs not in INPUTS:
            raise BadInput(f"judge option inputs={inputs!r}: one of {', '.join(INPUTS)}")
        self._url = check_base_url(base_url)
        self.model, self.base_url, self.inputs = model, base_url.rstrip("/"), inputs
        try:
            self.timeout_s, self.max_tokens = float(timeout_s), int(max_tokens)
            self.max_reply_bytes, self.max_consecutive_failures = int(max_reply_bytes), int(max_consecutive_failures)
        except (TypeError, ValueError):
            raise BadInput("judge options timeout_s, max_tokens, max_reply_bytes and max_consecutive_failures are "
                           "numbers") from None
        if not (self.timeout_s > 0 and self.max_reply_bytes > 0 and self.max_consecutive_failures >= 1):
            raise BadInput("judge options timeout_s and max_reply_bytes must be > 0, max_consecutive_failures >= 1")
        self._failures = 0  # failed requests in a row
        try:
            self.thinking_budget = int(thinking_budget)
        except (TypeError, ValueError):
            raise BadInput(f"judge option thinking_budget={thinking_budget!r}: a number of tokens") from None
        if self.thinking_budget < 0:
            raise BadInput("judge option thinking_budget must be >= 0")
        if reasoning_effort is not None and reasoning_effort not in ("low", "medium", "high"):
            raise BadInput(f"judge option reasoning_effort={reasoning_effort!r}: low, medium or high")
        self.reasoning_effort = reasoning_effort
        self.prompt_file, self.system_prompt, self.prompt_sha256 = load_prompt(prompt_file)
        self._key = resolve_secret_options({"api_key": api_key})["api_key"]

    def request_body(self, sample: JudgeSample) -> Dict[str, Any]:
        """The chat-completion request for one sample."""
        content: List[Dict[str, Any]] = [{"type": "text", "text": f"Task instruction: {sample.instruction}"}]
        for camera, role in sample.cameras.items():
            if self.inputs == "video":
                content.append({"type": "text", "text": f"Camera {camera} ({role.replace('_', '-')}), video:"})
                content.append({"type": "video_url", "video_url": {
                    "url": "data:video/mp4;base64," + base64.b64encode(sample.images["video"][camera]).decode()}})
                continue
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
        body: Dict[str, Any] = {"model": self.model, "temperature": 0, "max_tokens": self.max_tokens + self.thinking_budget,
                                "messages": [{"role": "system", "content": self.system_prompt},
                                             {"role": "user", "content": content}]}
        if self.thinking_budget:
            body["chat_template_kwargs"] = {"enable_thinking": True}
        if self.reasoning_effort:
            body["reasoning_effort"] = self.reasoning_effort
        return body

    def _post(self, data: bytes) -> bytes:
        """POST ``data`` to ``base_url/chat/completions``: the reply's body, within ``timeout_s`` in all.

        A watchdog shuts the socket down at the deadline, so neither a server that never answers nor
        one that drips its reply can hold the request longer. No redirect is followed.
        """
        parts = self._url
        conn_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = conn_class(parts.hostname, parts.port, timeout=self.timeout_s)
        expired = threading.Event()
        held = []  # the socket, kept here: the connection hands it to the response and forgets it

        def abort() -> None:
            expired.set()
            for sock in held:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        watchdog = threading.Timer(self.timeout_s, abort)
        watchdog.daemon = True
        watchdog.start()
        where = f"judge endpoint {self.base_url}"
        try:
            conn.connect()
            held.append(conn.sock)
            if expired.is_set():  # the deadline passed while connecting
                abort()
            conn.request("POST", f"{parts.path.rstrip('/')}/chat/completions", body=data,
                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {self._key}"})
            response = conn.getresponse()
            if 300 <= response.status < 400:
                raise PolicyServerError(f"{where} answered HTTP {response.status} (a redirect, to "
                                        f"{str(response.getheader('Location'))[:100]!r}); redirects are not followed, "
                                        f"so the key is sent only to base_url: give the final address as base_url")
            if response.status != 200:
                error = PolicyServerError(f"{where} answered HTTP {response.status} ({str(response.reason)[:80]})")
                error.fatal = response.status in (401, 403)
                raise error
            chunks, total = [], 0
            while True:
                chunk = response.read1(65536) if hasattr(response, "read1") else response.read(65536)
                if not chunk:
                    break
                total += len(chunk)
                if total > self.max_reply_bytes:
                    raise PolicyServerError(f"{where} sent a reply over max_reply_bytes={self.max_reply_bytes}; refused")
                chunks.append(chunk)
            if expired.is_set():
                raise OSError("deadline")
            return b"".join(chunks)
        except PolicyServerError:
            raise
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if expired.is_set():
                raise PolicyServerTimeout(f"{where} did not answer within timeout_s={self.timeout_s:g} s (the whole "
                                          f"request)") from None
            raise PolicyServerError(f"{where} unreachable or broke off: {type(exc).__name__}: {str(exc)[:200]}") from None
        finally:
            watchdog.cancel()
            conn.close()

    def _ask(self, body: Dict[str, Any]) -> str:
        """The text of the model's answer to ``body`` (a :class:`PolicyServerError` when there is none)."""
        return self._ask_with_reasoning(body)[0]

    def _ask_with_reasoning(self, body: Dict[str, Any]) -> Tuple[str, Optional[str]]:
        """The answer's text and the model's reasoning, if the reply holds any (see the module docstring)."""
        raw = self._post(json.dumps(body).encode())
        try:
            reply = json.loads(raw)
        except (ValueError, RecursionError):
            raise PolicyServerError(f"judge endpoint {self.base_url} answered something that is not JSON") from None
        try:
            message = reply["choices"][0]["message"]
            content = message["content"]
        except (KeyError, IndexError, TypeError):
            raise PolicyServerError(f"judge endpoint {self.base_url} answered without choices[0].message.content") from None
        reasoning = next((message[k] for k in ("reasoning_content", "reasoning")
                          if isinstance(message, dict) and isinstance(message.get(k), str) and message[k]), None)
        if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        if not isinstance(content, str):
            raise PolicyServerError(f"judge endpoint {self.base_url} answered a content that is not text "
                                    f"({json.dumps(content)[:60]})")
        return content, reasoning or reasoning_in(content)

    def judge(self, samples: Sequence[JudgeSample]) -> List[Verdict]:
        """One verdict per sample; a failed request is an error verdict for its sample (see the module docstring).

        Raises:
            PolicyServerError: HTTP 401/403, or ``max_consecutive_failures`` failed requests in a row.
        """
        verdicts = []
        for sample in samples:
            try:
                text, reasoning = self._ask_with_reasoning(self.request_body(sample))
            except PolicyServerError as exc:
                self._failures += 1
                if getattr(exc, "fatal", False):
                    raise
                if self._failures >= self.max_consecutive_failures:
                    raise PolicyServerError(f"{self._failures} requests in a row failed, the judge stops (rerun "
                                            f"`judge` to resume); the last: {exc}") from None
                verdicts.append(Verdict(False, None, error=str(exc)))
                continue
            self._failures = 0
            verdict = parse_answer(_THINK.sub("", text)) or parse_answer(text)  # the answer, not the thinking
            if verdict is not None:
                verdict = Verdict(verdict.predicted_success, verdict.confidence, reasoning=reasoning)
            verdicts.append(verdict or Verdict(False, None, error=f"unreadable answer: {text[:120]!r}"))
        return verdicts

    def identity(self) -> Dict[str, Any]:
        return {"name": self.name, "model": self.model, "base_url": self.base_url, "inputs": self.inputs,
                "prompt_file": self.prompt_file, "prompt_sha256": self.prompt_sha256,
                "thinking_budget": self.thinking_budget, "reasoning_effort": self.reasoning_effort}


def load_prompt(path: Optional[str] = None) -> Tuple[str, str, str]:
    """(name, text, SHA-256 of its bytes) of a prompt template file (the default: ``prompts/openai.txt``).

    Read as a judge set's files are (a regular file, no link, at most ``MAX_PROMPT_BYTES``), UTF-8.

    Raises:
        BadInput: the file cannot be read, is too large, is not UTF-8 text or is empty.
    """
    from robocasa_shift.rundir.files import read_bytes

    target = Path(path) if path else DEFAULT_PROMPT_FILE
    try:
        data = read_bytes(target, None, MAX_PROMPT_BYTES, "prompt file")
        text = data.decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"judge option prompt_file={str(target)[:200]!r}: cannot be read as UTF-8 text of at most "
                       f"{MAX_PROMPT_BYTES} bytes ({getattr(exc, 'strerror', None) or exc})") from None
    if not text:
        raise BadInput(f"judge option prompt_file={str(target)[:200]!r}: empty")
    name = target.name if target.resolve() == DEFAULT_PROMPT_FILE.resolve() else str(target)
    return name, text, hashlib.sha256(data).hexdigest()


def reasoning_in(content: str) -> Optional[str]:
    """The reasoning inside an answer's text: a ``<think>`` block, else the text around the JSON answer (None
    when the answer is the JSON alone)."""
    think = _THINK.search(content or "")
    if think and think.group(1).strip():
        return think.group(1).strip()
    rest = _JSON_OBJECT.sub("", content or "", count=1).strip()
    return rest or None


__all__ = ["DEFAULT_PROMPT_FILE", "OpenAIJudge", "check_base_url", "load_prompt", "parse_answer", "reasoning_in"]
