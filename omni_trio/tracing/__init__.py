"""The JSON-lines trace (:mod:`.trace`) and its views: summaries and the Perfetto timeline (:mod:`.views`)."""
