"""Turn a corpus into token files once: `python -m reference_train.prepare --out DIR`.

Sources (pick one; the default is the bundled offline corpus, no network):

    python -m reference_train.prepare --out data/offline
    python -m reference_train.prepare --out data/mine --text a.txt b.txt
    python -m reference_train.prepare --out data/mine --jsonl stories.jsonl --text-field text
    python -m reference_train.prepare --out data/chat --jsonl data_folder --tokenizer MODEL_DIR \
        --mask_prompt
    python -m reference_train.prepare --out data/tinystories \
        --hf-dataset roneneldan/TinyStories --tokenizer gpt2 --max-docs 100000

Tokenizer: byte-level by default (vocab 257, no download); `--tokenizer DIR`
uses the tokenizer.json of a local folder (a Llama checkpoint's, offline, for
training with --init_from DIR); `--tokenizer NAME` loads a Hugging Face tokenizer
by name. Both need `tokenizers` (or `transformers`) installed.

    python -m reference_train.prepare --out data/llama --text a.txt --tokenizer ~/models/my-llama
`--jsonl PATH` without --text-field reads mlx-lm's JSONL data: PATH is a folder
holding train.jsonl (and valid.jsonl, test.jsonl) or one .jsonl file (every
--val-every-th row to validation), rows {"text"}, {"prompt", "completion"} or
{"messages"} made into the token ids mlx-lm's dataset classes make
(reference_train/chat.py), one sequence per row ("reference_train.rows/1");
--mask_prompt trains only the completion / last assistant turn. Preference rows
{"prompt", "chosen", "rejected"} (mlx-lm-lora's, "system" too) become two sequences
each, chosen then rejected, their answers alone trained, for --objective dpo or orpo. `--jsonl FILE...
--text-field FIELD` reads that field as documents, packed like text files.
The output format is described in reference_train/data.py and docs/training-reference.md.
A run without --data trains on the offline corpus, tokenized here on first use
in each host's cache (`default_data_dir`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .chat import ChatTemplate, preference_tokens, read_rows, row_tokens
from .corpus import offline_corpus
from .data import (
    load_meta,
    read_hf_dataset,
    read_jsonl,
    read_text_files,
    write_row_files,
    write_token_files,
)
from .errors import DataError
from .tokenizer import make_tokenizer

OFFLINE_STORIES = 2000


def prepare_offline(out: str | Path, n_stories: int = OFFLINE_STORIES, seed: int = 0) -> dict:
    """Write the bundled generated corpus, byte-tokenized, to `out`."""
    docs = offline_corpus(n_stories, seed)
    return write_token_files(docs, make_tokenizer("byte"), out,
                             source=f"offline corpus ({n_stories} generated stories, seed {seed})")


def ensure_offline(out: str | Path) -> Path:
    """The offline token directory at `out`, prepared if it is not there yet."""
    out = Path(out)
    try:
        load_meta(out)
    except DataError:
        prepare_offline(out)
    return out


def default_data_dir() -> Path:
    """Where the bundled offline corpus is tokenized on first use (one copy per host):
    a run without --data trains on it, and exporting its checkpoints looks there."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "reference_train" / "offline-v1"


def ensure_default_data() -> Path:
    """The default data directory, prepared on this host if it is not there yet."""
    return ensure_offline(default_data_dir())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m reference_train.prepare",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory to write meta.json, train.bin, val.bin")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", nargs="+", metavar="FILE",
                     help="plain text files (split on <|endoftext|> when present)")
    src.add_argument("--jsonl", nargs="+", metavar="PATH",
                     help="mlx-lm's JSONL data: a folder with train.jsonl (valid.jsonl, "
                          "test.jsonl) or one .jsonl file; with --text-field, JSON Lines "
                          "files whose field is read as documents")
    src.add_argument("--hf-dataset", metavar="NAME", help="a Hugging Face dataset, e.g. roneneldan/TinyStories")
    p.add_argument("--text-field", default=None,
                   help="field holding the text (HF, default text; JSONL read as documents)")
    p.add_argument("--mask_prompt", "--mask-prompt", action="store_true",
                   help="JSONL chat / prompt-completion rows: train only the completion "
                        "(the last assistant turn), as mlx-lm's --mask-prompt")
    p.add_argument("--preference_for", "--preference-for", choices=("dpo", "orpo"), default="dpo",
                   help="preference rows: render them as mlx-lm-lora's DPO (default) or ORPO "
                        "data set does; they differ only for a chat template with thinking "
                        "tokens, which ORPO renders with enable_thinking false")
    p.add_argument("--split", default="train", help="HF dataset split to read")
    p.add_argument("--max-docs", type=int, default=None, help="stop after this many documents (HF)")
    p.add_argument("--tokenizer", default="byte",
                   help="'byte' (default), a local folder with a tokenizer.json (e.g. the "
                        "model's for --init_from), or a Hugging Face name, e.g. gpt2")
    p.add_argument("--val-every", type=int, default=20,
                   help="every N-th document goes to validation (default 20, i.e. 5%%)")
    p.add_argument("--stories", type=int, default=OFFLINE_STORIES,
                   help="number of generated stories for the offline corpus")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        tokenizer = make_tokenizer(args.tokenizer)
        if args.text:
            docs, source = read_text_files(args.text), f"text files: {', '.join(args.text)}"
        elif args.jsonl and args.text_field is None:
            return prepare_rows(args, tokenizer)
        elif args.jsonl:
            docs = read_jsonl(args.jsonl, args.text_field)
            source = f"JSONL files: {', '.join(args.jsonl)}"
        elif args.hf_dataset:
            docs = read_hf_dataset(args.hf_dataset, args.split, args.text_field or "text",
                                   args.max_docs)
            source = f"Hugging Face dataset {args.hf_dataset} ({args.split})"
        else:
            docs = offline_corpus(args.stories)
            source = f"offline corpus ({args.stories} generated stories, seed 0)"
        meta = write_token_files(docs, tokenizer, args.out, args.val_every, source)
    except (DataError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tr, va = meta["splits"]["train"], meta["splits"]["val"]
    print(f"wrote {args.out}: train {tr['tokens']:,} tokens ({tr['documents']} docs), "
          f"val {va['tokens']:,} tokens ({va['documents']} docs), {meta['dtype']}, "
          f"vocab {meta['vocab_size']}, from {source}")
    tok = meta["tokenizer"]
    if tok["kind"] == "folder":
        print(f"tokenizer: {tok['path']}/tokenizer.json (sha256 "
              f"{tok['tokenizer_json_sha256'][:12]}, eos id {tok['eos_id']}), kept in "
              f"{args.out}/tokenizer")
    return 0


def jsonl_splits(path: Path, val_every: int) -> dict[str, list]:
    """{split: [(file, line number, row, format)]} of mlx-lm's layout (a folder) or one file."""
    if path.is_dir():
        names = {"train": "train.jsonl", "val": "valid.jsonl", "test": "test.jsonl"}
        if not (path / "train.jsonl").is_file():
            raise DataError(f"{path}: no train.jsonl", "mlx-lm's layout: train.jsonl, and "
                            "valid.jsonl and test.jsonl when there are any")
        return {split: [(path / name, *r) for r in read_rows(path / name)]
                for split, name in names.items() if (path / name).is_file()}
    if not path.is_file():
        raise DataError(f"--jsonl {path}: no such file or folder")
    splits: dict[str, list] = {"train": [], "val": []}
    for i, r in enumerate(read_rows(path)):
        split = "val" if val_every > 0 and i % val_every == val_every - 1 else "train"
        splits[split].append((path, *r))
    return splits


def prepare_rows(args, tokenizer) -> int:
    """--jsonl in mlx-lm's formats: every row checked and tokenized before anything is
    written (a bad row: exit 2 naming the file and line, nothing written)."""
    if len(args.jsonl) != 1:
        raise DataError("--jsonl takes one folder or one .jsonl file for mlx-lm's formats",
                        "or name the field to read documents from with --text-field")
    path = Path(args.jsonl[0])
    splits = jsonl_splits(path, args.val_every)
    formats = {r[3] for rows in splits.values() for r in rows}
    preference = "preference" in formats
    if preference and len(formats) > 1:
        raise DataError(f"{path}: preference rows (chosen, rejected) and "
                        f"{', '.join(sorted(formats - {'preference'}))} rows in one data set",
                        "prepare preference pairs apart from supervised rows")
    template = None
    if formats - {"text"}:
        if not hasattr(tokenizer, "folder"):
            raise DataError(f"{', '.join(sorted(formats - {'text'}))} rows need the model's "
                            "chat template", "prepare with --tokenizer MODEL_DIR")
        template = ChatTemplate(tokenizer)
        template.thinking = not (preference and args.preference_for == "orpo")
    out: dict[str, list] = {}
    for split, rows in splits.items():
        out[split] = []
        for file, lineno, row, fmt in rows:
            try:
                if preference:  # two sequences a row: chosen, then rejected (data.PairSplit)
                    out[split].extend(preference_tokens(row, template))
                else:
                    out[split].append(row_tokens(row, fmt, tokenizer, template, args.mask_prompt))
            except DataError as e:
                raise DataError(f"{file}:{lineno}: {e.args[0]}", e.hint) from None
            except Exception as e:  # the template's own error (raise_exception, a bad field)
                raise DataError(f"{file}:{lineno}: the chat template failed: "
                                f"{type(e).__name__}: {e}") from None
    source = f"JSONL ({', '.join(sorted(formats))} rows): {path}"
    extra = {"mask_prompt": args.mask_prompt or preference, "preference": preference}
    if preference:
        extra["preference_for"] = args.preference_for
    meta = write_row_files(out, tokenizer, args.out, source, extra)
    unit = "pairs" if preference else "rows"
    counts = ", ".join(f"{s} {i['rows'] // (1 + preference)} {unit}, {i['tokens']:,} tokens "
                       f"({i['trained_tokens']:,} trained, longest {i['max_length']})"
                       for s, i in meta["splits"].items())
    print(f"wrote {args.out}: {counts}, {meta['dtype']}, vocab {meta['vocab_size']}, from {source}"
          f"{', prompts masked' if args.mask_prompt or preference else ''}")
    for split, info in meta["splits"].items():
        if info["untrained_rows"]:
            print(f"warning: {info['untrained_rows']} {split} rows train no token (the prompt "
                  "covers the whole row, as mlx-lm's offset does)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
