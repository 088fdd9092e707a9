"""The gRPC front end: the servicer, the relay process that terminates gRPC, and the link between them."""
