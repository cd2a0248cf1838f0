"""The runtime layer: ``open_pipeline`` (:mod:`.pipeline`), the placements the coordinator reaches the
stages through (:mod:`.embedded`: all in the caller's trio loop; :mod:`.worker_placement`: in worker
processes too, whose reports :mod:`.stage_reports` hands to the coordinator), what each process
assembles of a pipeline (:mod:`.assembly`), worker deaths (:mod:`.deaths`), worker supervision and
launchers (:mod:`.workers`: supervisor, launch, template, worker, spec; :mod:`.remote`: join,
ray_launch, worker_join).

Nothing is re-exported here: the public names come from :mod:`omni_trio`.
"""
