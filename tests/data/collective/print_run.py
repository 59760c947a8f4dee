"""Test helper for `collective watch`: print one fenced ```text block of a Markdown log.

usage: print_run.py LOG.md STATE BLOCK [BLOCK ...]

Each call prints the next BLOCK (0-based index of the ```text blocks) in the list, the
count kept in the STATE file; after the list is used up the last one repeats.
"""

import sys
from pathlib import Path

log, state, *order = sys.argv[1:]
blocks: list[str] = []
cur: list[str] = []
inside = False
for line in Path(log).read_text().splitlines():
    if line.startswith("```text"):
        inside, cur = True, []
    elif line.startswith("```") and inside:
        inside = False
        blocks.append("\n".join(cur))
    elif inside:
        cur.append(line)
st = Path(state)
n = int(st.read_text()) if st.exists() else 0
st.write_text(str(n + 1))
print(blocks[int(order[min(n, len(order) - 1)])])
