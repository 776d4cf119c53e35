"""The descriptor layer: one RAII Python class per cuDNN descriptor family.

Design decisions:

* **Validate in Python, before any C call.** Constructors take Python values (shapes, strides,
  numpy dtypes or ``enums.DataType``, layout names, mode names or enum members) and reject bad
  ones with ``TypeError`` (wrong kind of value), ``ValueError`` (wrong value) or
  ``OverflowError`` (beyond cuDNN's int32 limit), each naming the argument, the value and what
  was expected. Several cuDNN calls crash the process on bad input instead of returning an
  error, so validation is what keeps them unreachable. What only cuDNN can judge comes back as
  the categorised :class:`~pycudnn.errors.CudnnError` of the failing call.
* **Properties read back through ``cudnnGet*``**, never from a Python-side copy, so a descriptor
  wrapped with ``from_ptr`` reads correctly. (The spatial-transformer descriptor has no getter in
  cuDNN; it is the one family that remembers its arguments.)
* **Lifecycle** comes from :class:`pycudnn._resource.Resource`: finalizer armed right after
  ``cudnnCreate*``, idempotent ``close()``, ``with``, ``from_ptr``/``detach``, live counters.
* **No cuDNN deprecation warnings from this layer.** Most legacy descriptor functions are
  ``CUDNN_DEPRECATED`` in cuDNN 9, but they are the only way to build these descriptors, and a
  user who asked for a ``ConvolutionDescriptor`` chose nothing deprecated. The layer calls
  every C function through ``errors.checked(name, warn=False)``, which neither warns nor uses
  up the one-time warning: code calling ``pycudnn.api`` directly is still warned, once per
  function.
* **Handles are Handles, device buffers are protocols.** A cuDNN handle argument must be a
  ``pycudnn.Handle`` (recognised by its C type, ``_validate.as_handle``: a descriptor or a device
  array with ``.ptr`` is refused); a device buffer (dropout states) is any object with an int
  ``.ptr`` (``_types.HasPtr``) that is not a descriptor or handle. Both are kept alive by a strong
  reference; this package never imports ``handle`` or ``memory``.
* **One home for each rule.** Stride arithmetic and cuDNN's int limits come from
  ``pycudnn._layout``, dtype names from ``pycudnn._types``, the quiet checked call from
  ``pycudnn.errors``; the package does not keep copies of them.

Which file holds what:

``_validate.py``
    The argument checks shared by every family (ints, int sequences, spatial parameters, reals,
    enum and dtype coercion, handle pointers, strided-span limits) and the option tables that
    several families share. Pure Python, no C calls.
``_codec.py``
    The backend attribute codec: Python values to and from the C arrays of
    ``cudnnBackendSetAttribute`` / ``GetAttribute``, per ``BackendAttributeType``.
``backend.py``
    :class:`BackendDescriptor` (graph API) and its thin constructors. Which descriptor types
    each backend attribute takes comes from ``pycudnn/_generated/backend_attrs.py`` (generated
    by ``tools/gen_backend_attrs.py`` from cuDNN's documentation; cuDNN does not check that
    itself, ``BackendDescriptor.set`` does).
``_conv_operation.py``
    The one encoding of the convolution operations' attributes (forward, backward data,
    backward filter), which ``BackendDescriptor``'s constructors and the graph builder's
    convolution nodes use.
``tensor.py``
    :class:`TensorDescriptor`, :class:`FilterDescriptor`, ``BN_MIN_EPSILON``.
``convolution.py``
    :class:`ConvolutionDescriptor`.
``ops.py``
    :class:`PoolingDescriptor`, :class:`ActivationDescriptor`, :class:`LRNDescriptor`,
    :class:`OpTensorDescriptor`, :class:`ReduceTensorDescriptor`.
``rnn.py``
    :class:`DropoutDescriptor`, :class:`RNNDescriptor`, :class:`RNNDataDescriptor`.
``spatial_ctc.py``
    :class:`SpatialTransformerDescriptor`, :class:`CTCLossDescriptor`.

Import every public name from here (``pycudnn.descriptors.TensorDescriptor``) or from
``pycudnn``; the files above are the layout, not the API.
"""

from __future__ import annotations

from .._resource import live_counts
from .backend import BackendDescriptor
from .convolution import ConvolutionDescriptor
from .ops import (
    ActivationDescriptor,
    LRNDescriptor,
    OpTensorDescriptor,
    PoolingDescriptor,
    ReduceTensorDescriptor,
)
from .rnn import DropoutDescriptor, RNNDataDescriptor, RNNDescriptor
from .spatial_ctc import CTCLossDescriptor, SpatialTransformerDescriptor
from .tensor import BN_MIN_EPSILON, FilterDescriptor, TensorDescriptor

__all__ = [
    "BN_MIN_EPSILON",
    "ActivationDescriptor",
    "BackendDescriptor",
    "CTCLossDescriptor",
    "ConvolutionDescriptor",
    "DropoutDescriptor",
    "FilterDescriptor",
    "LRNDescriptor",
    "OpTensorDescriptor",
    "PoolingDescriptor",
    "RNNDataDescriptor",
    "RNNDescriptor",
    "ReduceTensorDescriptor",
    "SpatialTransformerDescriptor",
    "TensorDescriptor",
    "live_counts",
]
