# Sourced by the scripts that generate PII data with Faker: sets `PY` to a Python that imports faker (python3,
# or the virtualenv target/venv-faker, made from PyPI when neither has it). Run from the repository root.
PY=python3
if [ -x target/venv-faker/bin/python ]; then PY=target/venv-faker/bin/python; fi
if ! "$PY" -c 'import faker' 2>/dev/null; then
  python3 -m venv target/venv-faker && target/venv-faker/bin/pip install -q faker
  PY=target/venv-faker/bin/python
fi
