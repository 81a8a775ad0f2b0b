"""One profile's life: the request checked, queued per target, run window by window, postprocessed."""
