"""Reading files into the core's types: the packaged profiles (profiles) and job traces (traces).

The only place outside the SDK, meshd and the CLI that opens files; the core never imports it."""
