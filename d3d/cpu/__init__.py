"""CPU matmuls and the precision policy: dtype and weight choice per machine, prepacked and quantized matrices."""
