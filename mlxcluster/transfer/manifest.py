"""What a transfer moves: files by name, size and sha256, hashed on this machine.

A ``Manifest`` is a folder as the hosts name it and its files; the hash of
each is taken here, once, by ``reference_train.files.file_sha256`` (the
one sha256 of a file on this machine: the trainer's own, which vouches for
its token folders and checkpoints). The host's side hashes with
``agent.sha256_of``: the agent runs there with the standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from mlxcluster.errors import InputError
from reference_train.files import file_sha256

# In a view of a model only the hosts hold (transfer/view.py): never a source to send.
VIEW_MARK = ".mlxcluster-view"


@dataclass(frozen=True)
class DataFile:
    name: str  # below the folder, with '/' (tokenizer/tokenizer.json)
    bytes: int
    sha256: str
    path: str = ""  # where it is here, when not at the manifest's folder/name (a wheel)

    @classmethod
    def of(cls, path: str | Path, name: str) -> DataFile:
        """The file at ``path`` here, hashed, to be named ``name`` there."""
        return cls(name, Path(path).stat().st_size, file_sha256(path))

    def spec(self) -> dict:
        return {"name": self.name, "bytes": self.bytes, "sha256": self.sha256}


@dataclass(frozen=True)
class Manifest:
    """What a whole copy of a folder holds (meta.json last)."""

    folder: str  # absolute: the ranks open the same path on every host (or ~/...: each host's own)
    files: tuple[DataFile, ...]
    source: str | None = None  # the folder here, when it is not ``folder`` (launch/code.py)

    @property
    def here(self) -> str:
        """The folder on this machine the files are read from."""
        return self.source or self.folder

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def path_here(self, f: DataFile) -> str:
        return f.path or f"{self.here}/{f.name}"

    def spec(self, files: Sequence[DataFile] | None = None, **more) -> dict:
        """What the agent is given: the folder there and the files."""
        return {"dir": self.folder,
                "files": [f.spec() for f in (self.files if files is None else files)], **more}


def folder_manifest(folder: str | Path) -> Manifest:
    """Every file under ``folder`` (a model folder), hashed here (but dot
    files and folders: the storage tokens of a run beside it, caches). A
    view of a model the hosts hold (transfer/view.py) is refused: its weight
    files are headers and zeros, never to be sent as the model."""
    path = Path(folder).resolve()
    if not path.is_dir():
        raise InputError(f"no such folder here: {folder}",
                         "give the path of the folder on this machine (it is sent to every host)")
    if (path / VIEW_MARK).exists():
        raise InputError(f"{folder} is a view of a model only the hosts hold (its weight files "
                         f"are their headers alone): it is never sent",
                         "give the model's own folder, or its Hugging Face id with "
                         "--download-on HOST")
    return Manifest(str(path), tuple(
        DataFile.of(f, f.relative_to(path).as_posix())
        for f in sorted(path.rglob("*"))
        if f.is_file() and not any(part.startswith(".") for part in f.relative_to(path).parts)))


def file_manifest(path: str | Path) -> Manifest:
    """One file (a `run` script) as a manifest of its folder."""
    path = Path(path).resolve()
    return Manifest(str(path.parent), (DataFile.of(path, path.name),))


def files_manifest(folder: str, paths: Sequence[Path]) -> Manifest:
    """Files from anywhere here (wheels from several fetch folders), to go
    side by side into ``folder`` there, each by its own name."""
    return Manifest(folder, tuple(replace(DataFile.of(p, p.name), path=str(p)) for p in paths))
