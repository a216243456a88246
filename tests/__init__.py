"""The test suite: ``unit/`` (no engine: ``make test-fast``), ``engine/`` (a real vLLM engine),
``server/`` (a real server, the openai client, the CLI, the corpus job); helpers in ``support/``."""
