#!/usr/bin/env bash
# Build dlperf's C extension for the lent GPU machine and put it in .devext/ (ignored by git) to
# carry there: that machine's python3 is another version (3.12) and may lack Debian's
# libjpeg.so.62. The extension uses only the limited API (loads on any CPython >= 3.11) and
# finds the libjpeg-turbo copied beside it through its RUNPATH ($ORIGIN).
# scripts/device_check.sh copies .devext/* into dlperf/data/ when it finds the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
INC=$($PY -c "import sysconfig; print(sysconfig.get_paths()['include'])")
LIB=$(gcc -print-file-name=libjpeg.so.62)
[ -f "$LIB" ] || { echo "libjpeg.so.62 not found (apt-get install libjpeg62-turbo-dev)" >&2; exit 1; }
mkdir -p .devext
grep -qx '/.devext/' .git/info/exclude 2>/dev/null || echo /.devext/ >> .git/info/exclude
gcc -shared -fPIC -O2 -DPy_LIMITED_API=0x030B0000 -I"$INC" dlperf/data/_jpegroi.c dlperf/data/jpegroi.c \
    -o .devext/_jpegroi.abi3.so -ljpeg -Wl,-rpath,'$ORIGIN'
cp -L "$LIB" .devext/libjpeg.so.62
echo "built .devext/: $(ls .devext | tr '\n' ' ')"
