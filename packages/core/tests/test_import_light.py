import json
import subprocess
import sys

HEAVY = ("datasets", "litellm", "torch", "yaml", "numpy", "pandas", "pyarrow", "openai", "transformers", "httpx")


def test_import_reinforge_loads_nothing_heavy():
    code = "import json, sys, reinforge; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = {m.split(".")[0] for m in json.loads(out.stdout)}
    assert not loaded & set(HEAVY), f"import reinforge loaded {sorted(loaded & set(HEAVY))}"
    assert "pluggy" in loaded
