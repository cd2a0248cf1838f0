"""The trust boundary: the control messages and their field checks, the codec, frame authentication
and CURVE keys. Everything a peer sends is checked here before any other layer sees it."""
