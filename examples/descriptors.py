"""RAII descriptors, validated and read back through cuDNN. Needs libcudnn, no GPU (README)."""

from pycudnn import ConvolutionDescriptor, FilterDescriptor, TensorDescriptor

x = TensorDescriptor((8, 3, 224, 224), "float16", layout="NHWC")
w = FilterDescriptor((64, 3, 7, 7), "float16", layout="NHWC")
with ConvolutionDescriptor(pad=3, stride=2, compute_type="float32") as conv:
    print(conv.forward_output_shape(x, w))      # (8, 64, 112, 112)
print(x)            # TensorDescriptor(shape=(8, 3, 224, 224), dtype=float16, layout=NHWC)
print(x.strides, x.size_in_bytes)               # (150528, 1, 672, 3) 2408448
try:
    ConvolutionDescriptor(pad=(1, 1), stride=(1, 1, 1))
except ValueError as e:
    print(e)        # stride=(1, 1, 1) has 3 entries; expected 2
