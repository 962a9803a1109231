"""Edits of a reference script's copy, each of a text that must be there exactly once: shared by
dev/bench_quality.py (record #28's train_gpt.py) and dev/reference89_offline.py (record #89's)."""


class ScriptEditError(Exception):
    pass


def edit_script(source, edits, path, script):
    """source with each (expected, replacement) made; raises ScriptEditError naming the first expected
    text not there exactly once (another version of `script`, which the edits would not run as
    intended)."""
    for expected, replacement in edits:
        count = source.count(expected)
        if count != 1:
            raise ScriptEditError(f"{path}: expected the line '{expected}' once ({script}), found it {count} "
                                  "times: not the script these edits are for")
        source = source.replace(expected, replacement)
    return source
