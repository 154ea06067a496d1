"""One adapter per peer implementation: each runs the peer's own code (imported inside its functions) and returns
its results in this project's layout, or, where a peer cannot run on a CPU (Transformer Engine), holds a
transcription of its reference code labelled with the commit it was read from."""
