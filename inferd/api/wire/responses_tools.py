"""The Responses API's function tools onto chat's (inferd.api.wire.tools): its flat tool shape ({type:
"function", name, parameters, strict, description}) and its tool_choice ({type: "function", name}), so the
template's tools section, the grammar of "required" and a named function, and the model's call parser are
chat's. Errors name the Responses API's own fields (`tools[i].parameters`, not chat's `.function.`)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from inferd.api.errors import ApiError
from inferd.api.wire.tools import FunctionDefinition, NamedFunction, NamedToolChoice, Tool, prepare_tools


def prepare_response_tools(req: Any, out: Any) -> None:
    """Fill out.tools / tool_choice / tool_name / parallel_tool_calls (and the grammar of required/named)
    from a ResponsesRequest, as chat's prepare_tools does from a chat request."""
    tools = [Tool(type="function", function=FunctionDefinition(name=t.name, description=t.description,
                                                               parameters=t.parameters, strict=t.strict))
             for t in req.tools or []]
    choice = req.tool_choice
    if choice == "auto" and not tools:      # the Responses API's default, so a client may send it with no tools
        choice = None
    if choice is not None and not isinstance(choice, str):
        choice = NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
    try:
        prepare_tools(SimpleNamespace(tools=tools, tool_choice=choice, parallel_tool_calls=req.parallel_tool_calls),
                      out)
    except ApiError as err:
        raise _flat(err) from None


def _flat(err: ApiError) -> ApiError:
    """chat's `tools[i].function.<field>` is the Responses API's `tools[i].<field>`."""
    if err.param is None or ".function." not in err.param:
        return err
    return ApiError(err.status, err.message.replace(".function.", "."), type=err.type,
                    param=err.param.replace(".function.", "."), code=err.code)
