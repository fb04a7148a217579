"""Pure parsers for macOS (and ibverbs) command output.

One module per command. Each parser takes the raw text a command printed and
returns typed values; unknown or damaged input degrades to None / "unknown"
fields and never raises.
"""
