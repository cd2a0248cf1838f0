"""The runtime layer: ``open_pipeline`` (:mod:`.pipeline`), what each process assembles of a pipeline
(:mod:`.assembly`), worker supervision (:mod:`.supervisor`, :mod:`.deaths`, :mod:`.directory`), the
launchers (local: :mod:`.launch`, :mod:`.template`; ``manual``: :mod:`.join`; ``ray``:
:mod:`.ray_launch`; both through :mod:`.remote`) and the worker's main (:mod:`.worker`,
:mod:`.worker_join`, told what to run by :mod:`.spec`).

Nothing is re-exported here: the public names come from :mod:`omni_trio`.
"""
