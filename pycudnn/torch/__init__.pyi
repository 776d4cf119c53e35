# The public names of ``pycudnn.torch``, declared once. Type checkers read this stub;
# ``pycudnn/torch/__init__.py`` derives its lazy table, ``__all__`` and ``dir()`` from it
# (``pycudnn._exports``), importing a name's module, and torch, on its first use.

from ._runtime import (
    TorchMemoryResource as TorchMemoryResource,
    to_torch as to_torch,
    use_torch_allocator as use_torch_allocator,
)
from .activation import (
    ELU as ELU,
    Hardtanh as Hardtanh,
    ReLU as ReLU,
    ReLU6 as ReLU6,
    Sigmoid as Sigmoid,
    SiLU as SiLU,
    Tanh as Tanh,
)
from .attention import scaled_dot_product_attention as scaled_dot_product_attention
from .attention_scope import (
    AttentionCalls as AttentionCalls,
    AttentionRoute as AttentionRoute,
    attention_calls as attention_calls,
    register_transformers as register_transformers,
    use_cudnn_attention as use_cudnn_attention,
)
from .batchnorm import (
    BatchNorm1d as BatchNorm1d,
    BatchNorm2d as BatchNorm2d,
    BatchNorm3d as BatchNorm3d,
)
from .conv import Conv1d as Conv1d, Conv2d as Conv2d, Conv3d as Conv3d
from .conv_transpose import (
    ConvTranspose1d as ConvTranspose1d,
    ConvTranspose2d as ConvTranspose2d,
    ConvTranspose3d as ConvTranspose3d,
)
from ._convert import (
    convert as convert,
    supported_modules as supported_modules,
    unsupported_reason as unsupported_reason,
)
from .dropout import Dropout as Dropout
from .fuse import fusions as fusions, programs as programs
from .region import use_programs as use_programs
from .report import (
    ConversionReport as ConversionReport,
    ModuleConversion as ModuleConversion,
    conversion_report as conversion_report,
)
from .linear import Linear as Linear
from .loss import CrossEntropyLoss as CrossEntropyLoss
from .lrn import LocalResponseNorm as LocalResponseNorm
from .norm import LayerNorm as LayerNorm, RMSNorm as RMSNorm
from .pool import (
    AvgPool2d as AvgPool2d,
    AvgPool3d as AvgPool3d,
    MaxPool2d as MaxPool2d,
    MaxPool3d as MaxPool3d,
)
from .rnn import GRU as GRU, LSTM as LSTM, RNN as RNN, rnn_flat_weights as rnn_flat_weights
from .softmax import LogSoftmax as LogSoftmax, Softmax as Softmax

def is_available() -> bool: ...
