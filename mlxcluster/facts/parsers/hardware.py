"""Parse ``system_profiler SPHardwareDataType`` (``-json`` or plain text).

``number_processors`` is a string like "proc 16:12:4" on Apple silicon and
an int on Intel Macs; the text form says "8 (4 performance and 4 efficiency)".
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from mlxcluster.facts.parsers.indented import parse_outline


@dataclass(frozen=True)
class Hardware:
    model_name: str | None = None  # "MacBook Pro"
    model_id: str | None = None  # "Mac16,5"
    chip: str | None = None  # "Apple M4 Max"
    memory_gb: float | None = None
    cores: int | None = None
    serial: str | None = None
    uuid: str | None = None  # platform (hardware) UUID


def _memory(text: object) -> float | None:
    m = re.match(r"\s*([\d.]+)\s*(GB|TB|MB)", text) if isinstance(text, str) else None
    if not m:
        return None
    scale = {"MB": 1 / 1024, "GB": 1, "TB": 1024}[m.group(2)]
    return float(m.group(1)) * scale


def _cores(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        m = re.search(r"(\d+)", value)
        return int(m.group(1)) if m else None
    return None


def _s(value: object) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def parse_hardware_json(text: str | None) -> Hardware:
    """Parse ``system_profiler SPHardwareDataType -json``; unknown shapes give Hardware()."""
    try:
        data = json.loads(text or "")
        item = data["SPHardwareDataType"][0]
        if not isinstance(item, dict):
            return Hardware()
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
        return Hardware()
    return Hardware(
        model_name=_s(item.get("machine_name")),
        model_id=_s(item.get("machine_model")),
        chip=_s(item.get("chip_type")) or _s(item.get("cpu_type")),
        memory_gb=_memory(item.get("physical_memory")),
        cores=_cores(item.get("number_processors")),
        serial=_s(item.get("serial_number")),
        uuid=_s(item.get("platform_UUID")),
    )


def parse_hardware_text(text: str | None) -> Hardware:
    """Parse plain ``system_profiler SPHardwareDataType``."""
    fields = {n.key: n.value for n in parse_outline(text or "").walk() if n.value}
    return Hardware(
        model_name=fields.get("Model Name"),
        model_id=fields.get("Model Identifier"),
        chip=fields.get("Chip") or fields.get("Processor Name"),
        memory_gb=_memory(fields.get("Memory")),
        cores=_cores(fields.get("Total Number of Cores")),
        serial=fields.get("Serial Number (system)"),
        uuid=fields.get("Hardware UUID"),
    )


def parse_hardware(text: str | None) -> Hardware:
    """Either form: JSON when the text starts with ``{``."""
    if (text or "").lstrip().startswith("{"):
        return parse_hardware_json(text)
    return parse_hardware_text(text)
