"""The stage layer: the IO shell around one scheduler (inputs, routing, outbound lanes, the bridge to
the scheduler's thread); see :mod:`omni_trio.stage.stage`."""
