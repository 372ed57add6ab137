from .executor import CppExecutorError
from .request import LoRARequest
from .result import CompletionOutput, GenerationResult, IterationResult
from .utils import RequestError

__all__ = ["CppExecutorError", "LoRARequest", "CompletionOutput", "GenerationResult", "IterationResult",
           "RequestError"]
