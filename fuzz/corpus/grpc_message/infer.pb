
m*
INPUT0FP32