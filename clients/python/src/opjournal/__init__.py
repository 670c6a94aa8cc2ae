"""Generated protobuf and gRPC modules of the opjournal contract (``proto/opjournal``)."""
