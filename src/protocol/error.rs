//! Why a KServe v2 body was refused: one variant per rule, each message naming the
//! offending field by its JSON path so the sender knows exactly what to fix.

use super::Datatype;

/// A body that breaks the KServe v2 protocol or Triton's binary tensor extension.
///
/// Paths are JSON paths into the body (`inputs[1].shape`); `data[i]` counts elements
/// in row-major order, whether the array was sent flat or nested.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The JSON part of the body is not well-formed JSON.
    #[error("{body} body is not JSON: {detail}")]
    NotJson {
        /// `"request"` or `"response"`.
        body: &'static str,
        /// The parser's message, with line and column.
        detail: String,
    },
    /// The JSON is well formed but a field is missing or has the wrong type.
    #[error("{body} JSON is not a KServe v2 inference {body}: {detail}")]
    Malformed {
        /// `"request"` or `"response"`.
        body: &'static str,
        /// The parser's message, with line and column.
        detail: String,
    },
    /// The `inference-header-content-length` header is not a decimal byte count.
    #[error("inference-header-content-length {value:?} is not a byte count")]
    BadHeaderLen {
        /// The header value as received (lossy UTF-8).
        value: String,
    },
    /// The JSON header length points past the end of the body.
    #[error("inference-header-content-length {header_len} is larger than the body ({body_len} bytes)")]
    HeaderTooLong {
        /// The declared JSON header length.
        header_len: usize,
        /// The whole body's length.
        body_len: usize,
    },
    /// An infer request without inputs.
    #[error("inputs is empty; an inference request needs at least one input")]
    NoInputs,
    /// Two tensors share a name.
    #[error("{path}.name \"{name}\" is already used by {first}; tensor names must be unique")]
    DuplicateName {
        /// The later tensor, e.g. `inputs[2]`.
        path: String,
        /// The repeated name.
        name: String,
        /// The earlier tensor with that name.
        first: String,
    },
    /// A datatype name outside the protocol's table.
    #[error("{path}.datatype \"{value}\" is not a KServe v2 datatype")]
    UnknownDatatype {
        /// The tensor, e.g. `inputs[0]`.
        path: String,
        /// The name as sent.
        value: String,
    },
    /// A negative shape element.
    #[error("{path}.shape[{index}] is {value}; shape elements must be non-negative")]
    NegativeDim {
        /// The tensor.
        path: String,
        /// Position of the dimension.
        index: usize,
        /// The value as sent.
        value: i64,
    },
    /// A shape whose element count does not fit in 64 bits.
    #[error("{path}.shape {shape} holds more than 2^64 elements")]
    ShapeOverflow {
        /// The tensor.
        path: String,
        /// The shape, formatted `[a,b]`.
        shape: String,
    },
    /// JSON data with more or fewer elements than the shape holds.
    #[error("{path}.shape {shape} holds {expected} elements but data has {actual}")]
    ElementCount {
        /// The tensor.
        path: String,
        /// The shape, formatted `[a,b]`.
        shape: String,
        /// Product of the shape.
        expected: u64,
        /// Elements found in `data`.
        actual: u64,
    },
    /// One JSON element that the datatype cannot hold.
    #[error("{path}.data[{index}]: {problem}")]
    BadElement {
        /// The tensor.
        path: String,
        /// Row-major position of the element.
        index: u64,
        /// What is wrong with it, e.g. `300 is out of range for INT8`.
        problem: String,
    },
    /// A `data` field that is not an array, or is nested too deeply.
    #[error("{path}.data {problem}")]
    BadData {
        /// The tensor.
        path: String,
        /// What is wrong with it.
        problem: String,
    },
    /// FP16 or BF16 data sent as JSON, which Triton does not allow.
    #[error("{path}.data: {datatype} cannot be sent as JSON; send this tensor with the binary tensor extension")]
    JsonBinaryOnly {
        /// The tensor.
        path: String,
        /// Its datatype.
        datatype: super::Datatype,
    },
    /// A tensor with neither `data` nor `parameters.binary_data_size`.
    #[error("{path} has neither data nor parameters.binary_data_size")]
    NoData {
        /// The tensor.
        path: String,
    },
    /// A tensor with both `data` and `parameters.binary_data_size`.
    #[error("{path} has both data and parameters.binary_data_size; send one of them")]
    DataAndBinary {
        /// The tensor.
        path: String,
    },
    /// A tensor in the client's shared memory, which the gateway cannot reach.
    #[error(
        "{param}: tiergate cannot use shared memory (the client's regions are on another host than the model \
         servers it forwards to); send the tensor's data in the request instead"
    )]
    SharedMemory {
        /// Full path of the parameter, e.g. `outputs[0].parameters.shared_memory_region`.
        param: String,
    },
    /// A parameter the protocol defines, with a value of the wrong type or range.
    #[error("{param} must be {expected}, got {value}")]
    BadParameter {
        /// Full path of the parameter, e.g. `parameters.timeout`.
        param: String,
        /// What it must be, e.g. `a non-negative integer (microseconds)`.
        expected: &'static str,
        /// The value as sent, in JSON.
        value: String,
    },
    /// The binary section is not exactly as long as the tensors' `binary_data_size` sum.
    #[error("binary section is {actual} bytes but {tensors} declare binary_data_size {declared} in total")]
    BinarySection {
        /// `"inputs"` or `"outputs"`.
        tensors: &'static str,
        /// Bytes after the JSON header.
        actual: usize,
        /// Sum of `binary_data_size` over the tensors.
        declared: u128,
    },
    /// A fixed-size tensor whose `binary_data_size` does not match its shape.
    #[error("{path}.parameters.binary_data_size is {size} but {datatype} shape {shape} needs {expected} bytes")]
    BinarySize {
        /// The tensor.
        path: String,
        /// Declared size.
        size: u64,
        /// The tensor's datatype.
        datatype: Datatype,
        /// The shape, formatted `[a,b]`.
        shape: String,
        /// Element count times element size.
        expected: u128,
    },
    /// BYTES binary data whose length prefixes do not tile it into the shape's element count.
    #[error("{path}: BYTES binary data is malformed: {problem}")]
    BadBytes {
        /// The tensor.
        path: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A gRPC message that breaks a rule of the protocol's protobuf form.
    #[error("{path}: {problem}")]
    Grpc {
        /// Where, e.g. `raw_input_contents` or `inputs[1].contents`.
        path: String,
        /// What is wrong and what would be right.
        problem: String,
    },
}
