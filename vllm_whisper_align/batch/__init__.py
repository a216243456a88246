"""The corpus job: a manifest's bookkeeping (:mod:`.job`) and its replicas on Ray Data (:mod:`.on_ray`)."""
