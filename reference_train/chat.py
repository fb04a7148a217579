"""JSONL rows in mlx-lm's formats -> (token ids, first trained token), as mlx-lm makes them.

The formats (mlx-lm's LORA.md "Data"; the first row of a file decides, every row
must then have the same keys):

    {"text": "..."}                                      TextDataset
    {"prompt": "...", "completion": "..."}               CompletionsDataset (a user/assistant pair)
    {"messages": [{"role": ..., "content": ...}, ...]}   ChatDataset ("tools" too, where present)
    {"prompt": "...", "chosen": "...", "rejected": "..."} preference pairs (mlx-lm-lora's
                                                         DPODataset / ORPODataset), "system" too;
                                                         chosen / rejected may be a list of
                                                         messages (or {"messages": [...]})

Each row becomes one sequence `ids` and an `offset`: the targets trained are the
tokens ids[j] with offset <= j < len(ids) (j >= 1: the first token is never a
target). Without --mask_prompt the offset is 0; with it, it is the length of the
rendered prompt, exactly mlx-lm's `offset` (tuner/datasets.py): for a chat, the
messages before the last one, with the generation prompt when the last is the
assistant's, so that only the last assistant turn is trained.

Chat and completions rows go through the model folder's chat template, rendered
with jinja2 the way transformers' `apply_chat_template` renders it (a sandboxed
environment with trim_blocks, lstrip_blocks, loopcontrols, its tojson,
raise_exception, strftime_now, the tokenizer's named special tokens), and with
`enable_thinking` set as mlx-lm's TokenizerWrapper sets it (True when the
vocabulary has thinking tokens such as <think> and </think>, else False). The
text is then encoded without special tokens, as transformers does. The template
comes from chat_template.jinja when the folder has one, else tokenizer_config.json's
`chat_template` (transformers' order). jinja2 is imported only here, when chat
rows are prepared: training never needs it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from .data import json_lines
from .errors import DataError

FORMATS = {"text": ("text",), "completions": ("prompt", "completion"), "chat": ("messages",),
           "preference": ("prompt", "chosen", "rejected")}
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token")
THINK_PAIRS = (("<think>", "</think>"), ("<longcat_think>", "</longcat_think>"),
               ("<|think:start|>", "<|think:end|>"), ("<|channel>", "<channel|>"))
XTML = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")


def row_format(row: dict) -> str | None:
    """mlx-lm's choice (create_dataset): completions, then chat, then text; before them
    preference pairs (mlx-lm-lora's: chosen and rejected)."""
    if "chosen" in row and "rejected" in row:
        return "preference"
    if "prompt" in row and "completion" in row:
        return "completions"
    if "messages" in row:
        return "chat"
    if "text" in row:
        return "text"
    return None


def read_rows(path: Path) -> Iterator[tuple[int, dict, str]]:
    """(line number, row, format) of each non-empty line; DataError naming the line
    for anything that is not a row of the file's format."""
    fmt = None
    for lineno, line in json_lines(path):
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: a row must be a JSON object, not {type(row).__name__}")
        this = row_format(row)
        if this is None:
            raise DataError(f"{where}: no 'text' field, nor 'prompt' and 'completion', "
                            f"nor 'messages', nor 'chosen' and 'rejected' (keys: {', '.join(sorted(row)) or 'none'})",
                            "rows in mlx-lm's formats: see docs/training-reference.md, JSONL data")
        fmt = fmt or this
        if this != fmt:
            raise DataError(f"{where}: a {this} row in a file of {fmt} rows "
                            f"(the first row's format; it needs {' and '.join(FORMATS[fmt])})")
        check_row(row, fmt, where)
        yield lineno, row, fmt


def check_row(row: dict, fmt: str, where: str) -> None:
    if fmt == "preference":
        check_preference(row, where)
        return
    if fmt == "text":
        if not isinstance(row["text"], str):
            raise DataError(f"{where}: 'text' must be a string")
        return
    if fmt == "completions":
        for key in ("prompt", "completion"):
            if not isinstance(row[key], str):
                raise DataError(f"{where}: {key!r} must be a string")
    else:
        messages = row["messages"]
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{where}: 'messages' must be a non-empty list of messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise DataError(f"{where}: message {i} must be an object with a 'role' string")
            if "content" in m and not isinstance(m["content"], (str, list, type(None))):
                raise DataError(f"{where}: message {i}'s 'content' must be a string or a list")
    tools = row.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise DataError(f"{where}: 'tools' must be a list of objects (JSON schemas)")


def check_messages(messages, where: str, what: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: {what} must be a non-empty list of messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise DataError(f"{where}: {what}'s message {i} must be an object with a 'role' string")
        if not isinstance(m.get("content"), str):
            raise DataError(f"{where}: {what}'s message {i} must have a 'content' string")


def check_preference(row: dict, where: str) -> None:
    """A preference pair: a prompt string, the chosen and the rejected answer (a string, a
    list of messages or {"messages": [...]}), an optional system string."""
    if not isinstance(row.get("prompt"), str):
        raise DataError(f"{where}: a preference row needs a 'prompt' string",
                        'rows {"prompt": ..., "chosen": ..., "rejected": ...}: see '
                        "docs/training-reference.md, preference data")
    if "system" in row and not isinstance(row["system"], str):
        raise DataError(f"{where}: 'system' must be a string")
    for key in ("chosen", "rejected"):
        answer = row[key]
        if isinstance(answer, dict):
            answer = answer.get("messages")
        if not isinstance(answer, str):
            check_messages(answer, where, repr(key))
    score = row.get("preference_score", 1.0)
    if score != 1.0:  # mlx-lm-lora's ORPO scales the chosen log-probabilities by it
        raise DataError(f"{where}: 'preference_score' {score!r} is not supported (only 1, the "
                        "default, is)", "drop the field, or give 1")


def answer_messages(answer) -> list[dict]:
    """A preference row's chosen or rejected answer as the messages after the prompt."""
    if isinstance(answer, str):
        return [{"role": "assistant", "content": answer}]
    return list(answer["messages"] if isinstance(answer, dict) else answer)


def preference_tokens(row: dict, template: ChatTemplate) -> list[tuple[list[int], int]]:
    """[(chosen ids, prompt length), (rejected ids, prompt length)], as mlx-lm-lora's
    DPODataset makes them (its ORPODataset the same, with `template.thinking` False): the system message (when the row has one) and the prompt as
    the user's, then the answer, rendered without a generation prompt; the prompt's length
    is the system and user messages rendered with one. Only the answers' tokens train."""
    prompt = ([{"role": "system", "content": row["system"]}] if "system" in row else [])
    prompt.append({"role": "user", "content": row["prompt"]})
    offset = len(template.encode(prompt, add_generation_prompt=True))
    return [(template.encode(prompt + answer_messages(row[key])), offset)
            for key in ("chosen", "rejected")]


class ChatTemplate:
    """A model folder's chat template, rendered as transformers renders it, and the
    folder's tokenizer (FolderTokenizer) to encode the text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        folder = Path(tokenizer.folder)
        cfg = tokenizer._json("tokenizer_config.json")
        if cfg.get("chat_template_type"):
            raise DataError(f"{folder}: tokenizer_config.json names chat_template_type "
                            f"{cfg['chat_template_type']!r}, which mlx-lm renders with its own "
                            "Python code (mlx_lm/chat_templates), not reproduced here",
                            "prepare chat data for this model with mlx-lm's tools")
        jinja_file = folder / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        else:
            template = cfg.get("chat_template")
        if isinstance(template, list):  # several named templates
            template = {t["name"]: t["template"] for t in template}
        if not template:
            raise DataError(f"{folder}: no chat template (chat_template.jinja, or "
                            "chat_template in tokenizer_config.json)",
                            "chat and prompt/completion rows need the model's chat template")
        self.template = template
        specials = tokenizer._json("special_tokens_map.json")
        specials.update({k: v for k, v in cfg.items() if k in SPECIAL_TOKENS and v is not None})
        self.special_tokens = {k: (v.get("content") if isinstance(v, dict) else str(v))
                               for k, v in specials.items() if k in SPECIAL_TOKENS}
        vocab = tokenizer.tok.get_vocab(with_added_tokens=True)
        self.has_thinking = (any(a in vocab and b in vocab for a, b in THINK_PAIRS)
                             or all(t in vocab for t in XTML))
        self._compiled: dict[str, object] = {}
        # False: enable_thinking false even where the vocabulary has thinking tokens, as
        # mlx-lm-lora's ORPODataset renders (its prompt must prefix the answers' tokens)
        self.thinking = True

    def _compile(self, source: str):
        if source not in self._compiled:
            self._compiled[source] = jinja_environment().from_string(source)
        return self._compiled[source]

    def _source(self, tools) -> str:
        if isinstance(self.template, str):
            return self.template
        if tools is not None and "tool_use" in self.template:
            return self.template["tool_use"]
        if "default" in self.template:
            return self.template["default"]
        raise DataError(f"{self.tokenizer.folder}: several chat templates and none is 'default'")

    def render(self, messages: list[dict], tools=None, add_generation_prompt: bool = False) -> str:
        """The text transformers' apply_chat_template(tokenize=False) gives, with mlx-lm's
        enable_thinking."""
        chat = [alias_reasoning({k: v for k, v in m.items() if v is not None}) for m in messages]
        kwargs = {**self.special_tokens, "enable_thinking": self.has_thinking and self.thinking}
        return self._compile(self._source(tools)).render(
            messages=chat, tools=tools, documents=None,
            add_generation_prompt=add_generation_prompt, **kwargs)

    def encode(self, messages: list[dict], tools=None, add_generation_prompt: bool = False) -> list[int]:
        return self.tokenizer.encode(self.render(messages, tools, add_generation_prompt))


def alias_reasoning(message: dict) -> dict:
    """transformers fills `reasoning_content` (and `thinking`) from any of the three names."""
    for key in ("reasoning_content", "thinking", "reasoning"):
        if message.get(key) is not None:
            return {"thinking": message[key], **message, "reasoning_content": message[key]}
    return message


def jinja_environment():
    """transformers' chat template environment (utils/chat_template_utils.py)."""
    try:
        # Lazy: jinja2 is needed only to prepare chat data, never to train.
        import jinja2
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:
        raise DataError("chat templates need the 'jinja2' package, which is not installed",
                        "pip install jinja2") from e

    class Generation(Extension):  # {% generation %}...{% endgeneration %}: the text as it is
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = dict
    env.globals["namespace"] = jinja2.utils.Namespace
    return env


def row_tokens(row: dict, fmt: str, tokenizer, template: ChatTemplate | None,
               mask_prompt: bool) -> tuple[list[int], int]:
    """(ids, offset) of one row, as mlx-lm's dataset class for `fmt` processes it."""
    if fmt == "text":
        if mask_prompt:
            raise DataError("--mask_prompt needs prompt/completion or chat rows, and these are "
                            "text rows (mlx-lm: prompt masking not supported for text dataset)")
        ids = tokenizer.encode_with_specials(row["text"])
        if not ids or ids[-1] != tokenizer.eos_id:
            ids.append(tokenizer.eos_id)
        return ids, 0
    if template is None:
        raise DataError(f"{fmt} rows need a tokenizer with a chat template",
                        "prepare with --tokenizer MODEL_DIR (the model's folder)")
    tools = row.get("tools")
    if fmt == "completions":
        messages = [{"role": "user", "content": row["prompt"]},
                    {"role": "assistant", "content": row["completion"]}]
        generation_prompt = True
    else:
        messages = row["messages"]
        generation_prompt = messages[-1].get("role") == "assistant"
    ids = template.encode(messages, tools)
    if mask_prompt and len(messages) < 2:
        raise DataError("--mask_prompt needs a prompt: this chat has one message only")
    offset = len(template.encode(messages[:-1], tools, generation_prompt)) if mask_prompt else 0
    return ids, offset
