"""The endpoint plugin: OpenAI-compatible word timestamps and forced alignment over HTTP.

``launch`` starts vLLM's server (what ``serve`` execs), ``plugin`` is what vLLM loads, ``routes``
parses and answers HTTP, ``service`` runs requests on the engine and fetches their alignment from
the workers.
"""
