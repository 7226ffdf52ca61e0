#!/usr/bin/env bash
# Mutation testing of project/plan with mutmut (docs/mutation-plan.md has the last results).
#
#   bash scripts/mutation.sh            # the whole pass: counts by status
#   bash scripts/mutation.sh --diffs    # and every mutant left alive, one line each
#   MUTATION_ONLY=project/plan/batch.py bash scripts/mutation.sh   # one module (an fnmatch pattern)
#
# mutmut goes into its own virtual environment (MUTATION_VENV), which sees the project's packages through a .pth
# file: the project's .venv and its locks are not touched. The pass runs in a copy of the repository
# (MUTATION_WORK) with one test process at a time; about 4 minutes on 2 cores.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MUTMUT_VERSION=3.8.1
TMP=${TMPDIR:-/tmp}
VENV=${MUTATION_VENV:-$TMP/project-mutation-venv}
WORK=${MUTATION_WORK:-$TMP/project-mutation-work}
ONLY=${MUTATION_ONLY:-project/plan/*}
if [[ -n ${PROJECT_PYTHON:-} ]]; then
  PROJECT_PY=$PROJECT_PYTHON
elif [[ -x $ROOT/.venv/bin/python ]]; then
  PROJECT_PY=$ROOT/.venv/bin/python
else
  PROJECT_PY=$(command -v python3)
fi

# 1. mutmut in a separate venv that reads the project's site-packages (torch, lightning, pytest, the project).
if [[ ! -x $VENV/bin/mutmut ]] || [[ $("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("mutmut"))' 2>/dev/null) != "$MUTMUT_VERSION" ]]; then
  base=$("$PROJECT_PY" -c 'import sys; print(sys._base_executable)')
  rm -rf "$VENV"
  "$base" -m venv "$VENV"
  site=$("$PROJECT_PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  own=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  echo "import site; site.addsitedir('$site')" > "$own/zz_project_site.pth"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "mutmut==$MUTMUT_VERSION"
fi

# 2. A work copy: the sources, the tests, pyproject.toml (pytest's settings) and the mutmut config.
rm -rf "$WORK"
mkdir -p "$WORK"
cp -r "$ROOT/project" "$ROOT/tests" "$ROOT/pyproject.toml" "$WORK/"
find "$WORK" -name __pycache__ -prune -exec rm -rf {} +
tests=""
for file in test_plan.py test_degrees.py test_launcher_table.py test_import_contract.py; do
  tests+="    tests/unit/$file"$'\n'
done
# The sharding layer's plan rules, where the layer is installed (its degrees, memory and zero1 rows).
for file in test_sharded_degrees.py test_memory_plan.py test_zero1_plan.py; do
  [[ -e "$ROOT/tests/extras/sharding/unit/$file" ]] && tests+="    tests/extras/sharding/unit/$file"$'\n'
done
for file in "$ROOT"/tests/unit/test_plan_*.py; do
  [[ -e $file ]] && tests+="    tests/unit/$(basename "$file")"$'\n'
done
TESTS=$tests ONLY=$ONLY "$VENV/bin/python" - "$ROOT/scripts/mutation/setup.cfg" "$WORK/setup.cfg" <<'PY'
import os, sys
text = open(sys.argv[1]).read()
open(sys.argv[2], "w").write(text.replace("@TESTS@\n", os.environ["TESTS"]).replace("@ONLY@", os.environ["ONLY"]))
PY

# 3. The pass (its progress line goes to mutmut.log), then the summary.
cd "$WORK"
echo "mutmut $MUTMUT_VERSION over $ONLY in $WORK (log: $WORK/mutmut.log)"
if ! "$VENV/bin/mutmut" run --max-children 1 > mutmut.log 2>&1; then
  tail -c 4000 mutmut.log
  exit 1
fi
"$VENV/bin/python" "$ROOT/scripts/mutation/report.py" "$@"
