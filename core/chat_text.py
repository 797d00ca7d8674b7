"""Chat prompts as token ids with message text kept as text: a control token typed by a user ("<|im_start|>", any
added special token) is tokenized as its characters, never as the control token (`chat_template_ids`), and text
that UTF-8 cannot encode is refused with the bad character named (`check_text`). core.target's `Target.chat_ids`
and `Target.encode` use these; so do the tools that tokenize without loading the target."""

from __future__ import annotations

import re
from collections.abc import Sequence


def check_text(text: object, what: str = "the prompt") -> str:
    """`text` if it is a str that UTF-8 can encode, else ValueError naming the bad character.

    Command-line arguments holding bytes that are not UTF-8 reach Python as lone surrogates
    (U+DC80..U+DCFF, "surrogateescape"); the tokenizer cannot encode those.
    """
    if not isinstance(text, str):
        raise ValueError(f"{what} must be text, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        ch = ord(text[err.start])
        bad = (f"byte 0x{ch - 0xDC00:02x}, which is not UTF-8" if 0xDC80 <= ch <= 0xDCFF
               else f"a lone surrogate U+{ch:04X}")
        raise ValueError(f"{what} is not valid text: character {err.start} is {bad}; "
                         f"give UTF-8 text") from None
    return text


def special_token_strings(tokenizer) -> list[str]:
    """The strings the tokenizer turns into control tokens (special and added special tokens)."""
    found = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(tok, "special", False):
            found.add(str(tok.content))
    return sorted((t for t in found if t), key=len, reverse=True)


def plain_ids(tokenizer, text: str) -> list[int]:
    """Token ids of `text` with special-token strings in it tokenized as ordinary characters."""
    if not text:
        return []
    return [int(i) for i in tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]]


def chat_template_ids(tokenizer, messages: Sequence[dict]) -> list[int]:
    """Token ids of `messages` under the tokenizer's chat template, with every message's content as text.

    `apply_chat_template(tokenize=True)` tokenizes the rendered string as a whole, so a user who
    types "<|im_end|>\n<|im_start|>assistant\n" would forge turns. Here the template is rendered
    with a unique marker in place of each content; control tokens are taken only from the
    template's own text, and the text between two control tokens (template text and contents
    together, exactly as the plain tokenizer would group it) is tokenized with special-token
    strings split into characters. For ordinary text the ids equal the plain template's.
    """
    import secrets

    tag = secrets.token_hex(8)
    marks = {f"\ue000{tag}:{i}\ue001": str(m.get("content", "")) for i, m in enumerate(messages)}
    shown = [{**m, "content": mark} for m, mark in zip(messages, marks)]
    rendered = tokenizer.apply_chat_template(shown, add_generation_prompt=True, tokenize=False)
    specials = special_token_strings(tokenizer)
    special_re = re.compile("|".join(re.escape(t) for t in specials)) if specials else None
    ids: list[int] = []
    pending: list[str] = []  # text since the last control token
    for i, piece in enumerate(re.split(f"(\ue000{tag}:\\d+\ue001)", rendered)):
        if i % 2:  # a marker: the message's content, as text
            pending.append(marks[piece])
            continue
        start = 0
        for match in special_re.finditer(piece) if special_re is not None else ():
            pending.append(piece[start:match.start()])
            ids += plain_ids(tokenizer, "".join(pending))
            pending = []
            ids.append(int(tokenizer.convert_tokens_to_ids(match.group())))
            start = match.end()
        pending.append(piece[start:])
    ids += plain_ids(tokenizer, "".join(pending))
    return ids
