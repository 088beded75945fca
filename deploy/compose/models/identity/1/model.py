"""Triton Python backend: returns INPUT0 as OUTPUT0 (a stand-in model for compose)."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", data)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
