"""python -m core.trace [--write]: print the JSON Schema derived from core/trace/schema.py,
or rewrite data/schema/serving-trace-1.json and the field tables of docs/trace-format.md."""
from __future__ import annotations

import sys

from core.trace.schema import DOC_FILE, ROOT, SCHEMA_FILE, docs_with_tables, json_schema_text

if sys.argv[1:] == ["--write"]:
    SCHEMA_FILE.write_text(json_schema_text())
    DOC_FILE.write_text(docs_with_tables(DOC_FILE.read_text()))
    print(f"wrote {SCHEMA_FILE.relative_to(ROOT)} and the field tables in {DOC_FILE.relative_to(ROOT)}")
elif sys.argv[1:]:
    sys.exit("usage: python -m core.trace [--write]")
else:
    sys.stdout.write(json_schema_text())
