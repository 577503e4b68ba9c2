"""Open Inference Protocol (KServe V2) types and codecs, independent of any transport."""
