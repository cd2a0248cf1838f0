"""The socket backends of the control plane: the same-host Unix link and ZMQ over TCP."""
