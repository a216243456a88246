"""Model files: the CTranslate2 converter (:mod:`.ct2`) and the bundled models (:mod:`.bundled`)."""
