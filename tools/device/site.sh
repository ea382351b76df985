# Sourced by the device scripts beside it, from the repository root, with PY, OUT and M (the
# machine file) set: unpacks the wheels in .whl/ (if any, unless SKIP_WHEELS=1) to /tmp/site,
# puts it and this tree's src/ on PYTHONPATH, and keeps the hub offline (nothing outside the
# machine can be reached). A failed unpack ends the script with exit code 3.
SITE=/tmp/site
if [ "${SKIP_WHEELS:-0}" != 1 ] && ls .whl/*.whl > /dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    .whl/*.whl > "$OUT/logs.txt" 2>&1 || { echo "wheel install failed" >> "$M"; exit 3; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
