"""Pure analyses over onnx-ir graphs: they read, return frozen results, and never mutate."""
