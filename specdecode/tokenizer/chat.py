"""Chat templates: Jinja rendered the way transformers renders them, so a prompt is byte-identical.

The environment mirrors transformers' `_compile_jinja_template` (ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loopcontrols; `raise_exception`, `strftime_now`, a non-escaping `tojson`,
and the restricted `dict`/`namespace`), because templates are untrusted code from model files.

No template: `apply_chat_template(None, ...)` renders ChatML (CHATML_TEMPLATE below), the format of
Qwen and SmolLM. `Tokenizer.apply_chat_template` only allows that fallback when the vocabulary has
the ChatML tokens, and raises InvalidRequestError otherwise.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specdecode.errors import InvalidRequestError, ModelFileError

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_REASONING = ("reasoning_content", "thinking", "reasoning")


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson HTML-escapes ('<' -> '\u003c'); transformers' does not, and templates expect that.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _TemplateDict:
    # `dict(...)` in a template, without exposing the dict type itself to attribute tricks.
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    # Namespaces refuse underscore names, so a template cannot reach CPython internals through them.
    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set namespace attribute {name!r}")


@lru_cache(maxsize=16)
def compile_template(template: str) -> jinja2.Template:
    """Compiled once per distinct template; a template that does not parse is a model-file problem."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                       dict=_TemplateDict(), namespace=_Namespace)
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ModelFileError(f"chat template does not parse: {e.message} (line {e.lineno})") from None


def _plain(value):
    # Only JSON-like data reaches the sandbox, as in transformers: subclasses (enums, numpy scalars)
    # are cut back to their base type, pydantic models dumped, anything else named by a placeholder.
    if value is None or type(value) in (str, int, float, bool):
        return value
    for base, plain in ((str, str.__str__), (int, int.__int__), (float, float.__float__)):
        if isinstance(value, base):
            return plain(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return (tuple if isinstance(value, tuple) else list)(_plain(v) for v in value)
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return _plain(value.item())
    if callable(getattr(value, "model_dump", None)):  # pydantic messages (server requests)
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _message(m: dict) -> dict:
    # Templates test keys for presence, so None-valued keys are dropped; reasoning under any of its
    # names is also offered as `reasoning_content` and `thinking` (transformers' aliasing).
    m = {k: v for k, v in _plain(m).items() if v is not None}
    reasoning = next((m[k] for k in _REASONING if k in m), None)
    return m if reasoning is None else {"thinking": reasoning, **m, "reasoning_content": reasoning}


def apply_chat_template(template: str | None, messages: list[dict], add_generation_prompt: bool = True,
                        bos_token: str = "", eos_token: str = "", tools=None, documents=None, **kw) -> str:
    """Render `messages` (dicts with role/content...) as a prompt string; ChatML when `template` is None.
    Extra keyword arguments (e.g. `enable_thinking=False`) are passed to the template as variables."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidRequestError("messages must be a list of objects with 'role' and 'content'")
    chat = [_message(m) for m in messages]
    try:
        return compile_template(template if template is not None else CHATML_TEMPLATE).render(
            messages=chat, add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token,
            tools=_plain(tools), documents=_plain(documents), **_plain(kw))
    except jinja2.exceptions.TemplateError as e:  # raise_exception(), undefined calls, sandbox refusals
        raise InvalidRequestError(f"chat template rejected the messages: {e.message or e}") from None
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise InvalidRequestError(f"chat template failed on these messages: {e}") from None
