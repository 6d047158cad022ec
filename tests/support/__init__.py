"""What the tests and the benchmarks share and the package does not ship: vLLM
worker extensions that record the steps, the tiny hybrid model, the demo
output's grammar (``tests/conftest.py`` puts the repository on ``PYTHONPATH``,
so that the vLLM processes a test starts import them too)."""
