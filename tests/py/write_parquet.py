"""Writes JSON rows (a list on stdin) to a Parquet file with pyarrow, as verl's and `datasets`'
preprocessing scripts do: nested structs and lists of structs inferred from the rows.

    python write_parquet.py OUT.parquet [COMPRESSION] < rows.json
"""
import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq

rows = json.load(sys.stdin)
compression = sys.argv[2] if len(sys.argv) > 2 else "snappy"
pq.write_table(pa.Table.from_pylist(rows), sys.argv[1], compression=compression)
