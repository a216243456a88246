"""Drivers of the engine: plan a request's windows (:mod:`.decoding`), generate, fetch the captured
attention, finish the results; synchronously over ``vllm.LLM`` for the Python API (:mod:`.offline`) and
asynchronously over the server's ``engine_client`` for HTTP and the corpus job (:mod:`.service`, its
threads shared in turn by :mod:`.fair_threads`).
"""
