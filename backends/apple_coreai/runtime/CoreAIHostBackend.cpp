/*
 * Core AI delegates on the host: ExecuTorch's runtime calls this backend,
 * which runs each delegate's asset on coreai-core's runtime (Linux CPU
 * included) through callbacks that host.py, beside this file, registers.
 *
 * Registered as CoreAICompositeBackend (coreai-partitioner) and CoreAIBackend
 * (upstream): both ship the same payload, a JSON manifest (Manifest.h).
 *
 * init    parses and validates the manifest (Manifest.h, upstream's rules),
 *         gathers the asset from the program's named data (inline, each
 *         file's size checked against the manifest) or the sidecar directory,
 *         and has the Python side check the bundle's digest, compile it and
 *         create the delegate's state (mutable buffers the delegate owns).  The state lives with the loaded
 *         program, one per asset there (the functions of one asset share it, as Core AI's do), so it carries
 *         from call to call and two loads never share it.
 * execute checks every input against the delegate's signature (count,
 *         dtype, rank, static sizes) before coreai-core sees it, runs the
 *         delegate, resizes dynamic outputs and copies the results out.
 *         With an event tracer (ETDump), the call is one profiling event,
 *         "coreai:<function>", and the Python side adds one per edge node
 *         the Core AI ops came from when the asset carries that mapping.
 * destroy releases the Python side's delegate.
 */

#include "coreai_host_abi.h"
#include "Manifest.h"

#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/event_tracer_hooks_delegate.h>
#include <executorch/runtime/core/exec_aten/util/dim_order_util.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/platform/log.h>
#include <executorch/runtime/platform/platform.h>

#include <atomic>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <sys/stat.h>
#include <time.h>
#include <vector>

namespace executorch {
namespace backends {
namespace coreai_host {

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::aten::Tensor;
using executorch::ET_RUNTIME_NAMESPACE::Backend;
using executorch::ET_RUNTIME_NAMESPACE::BackendExecutionContext;
using executorch::ET_RUNTIME_NAMESPACE::BackendInitContext;
using executorch::ET_RUNTIME_NAMESPACE::CompileSpec;
using executorch::ET_RUNTIME_NAMESPACE::DelegateHandle;
using executorch::ET_RUNTIME_NAMESPACE::NamedDataMap;
using executorch::runtime::ArrayRef;
using executorch::runtime::DebugHandle;
using executorch::runtime::Error;
using executorch::runtime::EventTracer;
using executorch::runtime::EventTracerEntry;
using executorch::runtime::EValue;
using executorch::runtime::FreeableBuffer;
using executorch::runtime::Result;
using executorch::runtime::Span;

namespace {

constexpr int64_t kErrorCapacity = 2048;
// ETDump takes a delegate event by name or by integer id, never both: a named one has id -1.
constexpr DebugHandle kNamedEvent = static_cast<DebugHandle>(-1);
constexpr int32_t kMaxDelegateIO = 1 << 14;

struct Callbacks {
  coreai_host_load_fn load = nullptr;
  coreai_host_signature_fn signature = nullptr;
  coreai_host_run_fn run = nullptr;
  coreai_host_release_fn release = nullptr;
};

std::mutex g_mutex;
Callbacks g_callbacks;
std::string g_sidecar_dir;
bool g_sidecar_dir_set = false;
std::atomic<int64_t> g_live_delegates{0};

Callbacks callbacks() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_callbacks;
}

// The sidecar directory: set by the Python side, else $COREAI_SIDECAR_DIR.
bool sidecar_dir(std::string* out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_sidecar_dir_set) {
    *out = g_sidecar_dir;
    return true;
  }
  const char* env = std::getenv("COREAI_SIDECAR_DIR");
  if (env != nullptr && *env != '\0') {
    *out = env;
    return true;
  }
  return false;
}

bool real_path(const std::string& path, std::string* out) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    return false;
  }
  *out = resolved;
  return true;
}

bool is_inside(const std::string& path, const std::string& directory) {
  return path.size() > directory.size() && path.compare(0, directory.size(), directory) == 0 &&
      (directory.back() == '/' || path[directory.size()] == '/');
}

size_t element_size(const std::string& dtype) {
  if (dtype == "float32" || dtype == "int32" || dtype == "uint32") return 4;
  if (dtype == "float16" || dtype == "bfloat16" || dtype == "int16" || dtype == "uint16") return 2;
  if (dtype == "int64" || dtype == "uint64" || dtype == "float64") return 8;
  if (dtype == "int8" || dtype == "uint8" || dtype == "bool") return 1;
  return 0;
}

// shape's byte size, or false on overflow.
bool byte_size(const std::vector<int64_t>& shape, size_t element, uint64_t* out) {
  uint64_t total = element;
  for (int64_t dim : shape) {
    if (dim != 0 && total > UINT64_MAX / static_cast<uint64_t>(dim)) {
      return false;
    }
    total *= static_cast<uint64_t>(dim);
  }
  *out = total;
  return true;
}

thread_local char t_last_error[kErrorCapacity] = "";

// The event tracer's clock minus CLOCK_MONOTONIC_RAW, in ticks, taken as the running delegate's event started:
// coreai-core stamps its op events with CLOCK_MONOTONIC_RAW, ETDump with ExecuTorch's PAL clock.
thread_local int64_t t_tracer_clock_offset = 0;

int64_t monotonic_ns() {
  struct timespec now;
  ::clock_gettime(CLOCK_MONOTONIC_RAW, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

int64_t ns_to_ticks(int64_t ns) {
  const et_tick_ratio_t ratio = executorch::runtime::pal_ticks_to_ns_multiplier();
  return ns * static_cast<int64_t>(ratio.denominator) / static_cast<int64_t>(ratio.numerator);
}

// Logs an error and keeps it for coreai_host_last_error().
__attribute__((format(printf, 1, 2))) void report(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(t_last_error, sizeof(t_last_error), format, args);
  va_end(args);
  ET_LOG(Error, "%s", t_last_error);
}

const char* dtype_name(int32_t code) {
  return executorch::runtime::toString(static_cast<ScalarType>(code));
}

} // namespace

// One loaded delegate: its id on the Python side, its signature, and the
// scratch the boundary structs live in (sized once, at init).
struct CoreAIDelegate {
  int64_t id = 0;
  std::string name;  // "method 'forward', asset <hash prefix>"
  std::string event_name;  // "coreai:<function>", the key of the whole call in its debug_handle_map
  std::vector<CoreAIHostTensor> input_signature;
  std::vector<CoreAIHostTensor> output_signature;
  std::vector<CoreAIHostTensor> inputs;
  std::vector<CoreAIHostTensor> outputs;
  std::vector<char> error;
};

class CoreAIHostBackend final : public ::executorch::ET_RUNTIME_NAMESPACE::BackendInterface {
 public:
  explicit CoreAIHostBackend(const char* backend_id) : backend_id_(backend_id) {}

  bool is_available() const override {
    return true;  // init explains what is missing when the Python side is not registered
  }

  Result<DelegateHandle*> init(
      BackendInitContext& context,
      FreeableBuffer* processed,
      ET_UNUSED ArrayRef<CompileSpec> compile_specs) const override {
    const char* method = context.get_method_name() ? context.get_method_name() : "?";
    Callbacks python = callbacks();
    if (python.load == nullptr) {
      report("%s delegate in method '%s': the Core AI host runtime is not registered; "
          "call coreai_partitioner.load_runtime_backend() in this process before loading the method",
          backend_id_,
          method);
      return Error::InvalidState;
    }

    Manifest manifest;
    std::string problem;
    if (!parse_manifest(processed->data(), processed->size(), &manifest, &problem)) {
      report("%s delegate in method '%s': %s; the .pte is corrupt or was not written by a Core AI "
          "backend, re-export the model",
          backend_id_,
          method,
          problem.c_str());
      return Error::InvalidProgram;
    }
    std::string manifest_json(static_cast<const char*>(processed->data()), processed->size());
    processed->Free();

    auto delegate = std::make_unique<CoreAIDelegate>();
    delegate->name = std::string(backend_id_) + " delegate in method '" + method + "' (asset " +
        manifest.hash.substr(0, 12) + ")";
    delegate->event_name = "coreai:" + (manifest.function.empty() ? std::string("main") : manifest.function);
    const char* name = delegate->name.c_str();
    if (manifest.is_aot_compiled()) {
      report("%s ships AOT-compiled .aimodelc bundles (%s), which run only on Apple devices; "
          "lower without aot_compile_config to get a portable .aimodel that runs here",
          name,
          manifest.packaging.c_str());
      return Error::NotSupported;
    }

    CoreAIHostLoadRequest request{};
    request.method = method;
    request.program = program_identity(context.get_named_data_map());
    request.manifest_json = manifest_json.c_str();
    request.manifest_nbytes = static_cast<int64_t>(manifest_json.size());

    std::vector<FreeableBuffer> buffers;
    std::vector<CoreAIHostFile> files;
    std::string asset_dir, asset_root;
    Error status = manifest.is_inline()
        ? gather_inline(manifest, context.get_named_data_map(), name, &buffers, &files)
        : locate_sidecar(manifest, name, &asset_dir, &asset_root);
    if (status != Error::Ok) {
      return status;
    }
    if (manifest.is_inline()) {
      request.files = files.data();
      request.num_files = static_cast<int64_t>(files.size());
    } else {
      request.asset_dir = asset_dir.c_str();
      request.asset_root = asset_root.c_str();
    }

    delegate->error.assign(kErrorCapacity, '\0');
    int32_t num_inputs = 0, num_outputs = 0;
    delegate->id = python.load(&request, &num_inputs, &num_outputs, delegate->error.data(), kErrorCapacity);
    buffers.clear();  // the Python side has its own copy of the asset now
    if (delegate->id <= 0) {
      report("%s: %s", name, delegate->error.data());
      return Error::InvalidProgram;
    }
    if (num_inputs < 0 || num_outputs < 0 || num_inputs > kMaxDelegateIO || num_outputs > kMaxDelegateIO) {
      report("%s: the asset declares %d inputs and %d outputs", name, num_inputs, num_outputs);
      python.release(delegate->id);
      return Error::InvalidProgram;
    }
    delegate->input_signature.resize(num_inputs);
    delegate->output_signature.resize(num_outputs);
    delegate->inputs.resize(num_inputs);
    delegate->outputs.resize(num_outputs);
    if (python.signature(
            delegate->id,
            delegate->input_signature.data(),
            delegate->output_signature.data(),
            delegate->error.data(),
            kErrorCapacity) != 0) {
      report("%s: %s", name, delegate->error.data());
      python.release(delegate->id);
      return Error::InvalidProgram;
    }
    g_live_delegates.fetch_add(1);
    return delegate.release();
  }

  Error execute(
      BackendExecutionContext& context,
      DelegateHandle* handle,
      Span<EValue*> args) const override {
    auto* delegate = static_cast<CoreAIDelegate*>(handle);
    const char* name = delegate->name.c_str();
    const size_t num_inputs = delegate->inputs.size();
    const size_t num_outputs = delegate->outputs.size();
    if (args.size() != num_inputs + num_outputs) {
      report("%s takes %zu inputs and %zu outputs, the method gives it %zu values; "
          "the .pte does not match its asset, export it again",
          name,
          num_inputs,
          num_outputs,
          args.size());
      return Error::InvalidArgument;
    }
    for (size_t i = 0; i < num_inputs; ++i) {
      Error status = check_input(*delegate, i, *args[i], &delegate->inputs[i]);
      if (status != Error::Ok) {
        return status;
      }
    }
    for (size_t i = 0; i < num_outputs; ++i) {
      const EValue& value = *args[num_inputs + i];
      if (!value.isTensor() ||
          static_cast<int32_t>(value.toTensor().scalar_type()) != delegate->output_signature[i].dtype) {
        report("%s: output %zu is not a %s tensor; the .pte does not match its asset, export it again",
            name,
            i,
            dtype_name(delegate->output_signature[i].dtype));
        return Error::InvalidArgument;
      }
    }

    Callbacks python = callbacks();
    if (python.run == nullptr) {
      report("%s: the Core AI host runtime was unregistered (interpreter shutting down?)", name);
      return Error::InvalidState;
    }
    EventTracer* tracer = context.event_tracer();
    EventTracerEntry event =
        executorch::runtime::event_tracer_start_profiling_delegate(tracer, delegate->event_name.c_str(), kNamedEvent);
    if (tracer != nullptr) {
      t_tracer_clock_offset = static_cast<int64_t>(event.start_time) - ns_to_ticks(monotonic_ns());
    }
    delegate->error[0] = '\0';
    if (python.run(
            delegate->id,
            delegate->inputs.data(),
            static_cast<int32_t>(num_inputs),
            delegate->outputs.data(),
            static_cast<int32_t>(num_outputs),
            tracer,
            delegate->error.data(),
            kErrorCapacity) != 0) {
      report("%s: %s", name, delegate->error.data());
      return Error::InvalidState;
    }

    for (size_t i = 0; i < num_outputs; ++i) {
      Error status = copy_output(*delegate, i, delegate->outputs[i], args[num_inputs + i]->toTensor());
      if (status != Error::Ok) {
        return status;
      }
    }
    executorch::runtime::event_tracer_end_profiling_delegate(tracer, event);
    return Error::Ok;
  }

  void destroy(DelegateHandle* handle) const override {
    auto* delegate = static_cast<CoreAIDelegate*>(handle);
    if (delegate == nullptr) {
      return;
    }
    Callbacks python = callbacks();
    if (python.release != nullptr) {
      python.release(delegate->id);
    }
    g_live_delegates.fetch_sub(1);
    delete delegate;
  }

 private:
  const char* backend_id_;

  // The inline asset's files, from the program's named data.
  Error gather_inline(
      const Manifest& manifest,
      const NamedDataMap* named_data,
      const char* name,
      std::vector<FreeableBuffer>* buffers,
      std::vector<CoreAIHostFile>* files) const {
    if (named_data == nullptr) {
      report("%s ships its asset inline, but the program has no named data; export it again", name);
      return Error::InvalidProgram;
    }
    buffers->reserve(manifest.files.size() + manifest.initial_state.size());
    files->reserve(manifest.files.size() + manifest.initial_state.size());
    for (const AssetFile& file : manifest.files) {
      Error status = fetch(manifest, file.path, name, named_data, buffers, files);
      if (status != Error::Ok) {
        return status;
      }
      if (static_cast<uint64_t>(files->back().nbytes) != file.size) {
        report("%s: the program's named data holds %lld bytes for '%s', its manifest says %llu; the .pte is "
               "corrupt, re-export the model", name, static_cast<long long>(files->back().nbytes),
               file.path.c_str(), static_cast<unsigned long long>(file.size));
        return Error::InvalidProgram;
      }
    }
    for (const InitialState& state : manifest.initial_state) {
      Error status = fetch(manifest, state.file, name, named_data, buffers, files);
      if (status == Error::Ok) {
        status = check_initial_state(state, static_cast<uint64_t>(files->back().nbytes), name);
      }
      if (status != Error::Ok) {
        return status;
      }
    }
    return Error::Ok;
  }

  // One file of the asset's <hash>/ directory, from the program's named data.
  static Error fetch(
      const Manifest& manifest,
      const std::string& path,
      const char* name,
      const NamedDataMap* named_data,
      std::vector<FreeableBuffer>* buffers,
      std::vector<CoreAIHostFile>* files) {
    std::string key = "coreai/" + manifest.hash + "/" + path;
    Result<FreeableBuffer> data = named_data->get_data(key.c_str());
    if (!data.ok()) {
      report("%s: the program's named data holds no '%s' (error 0x%x); the .pte is truncated or corrupt, "
             "re-export the model", name, key.c_str(), static_cast<unsigned>(data.error()));
      return Error::InvalidProgram;
    }
    buffers->push_back(std::move(data.get()));
    files->push_back({path.c_str(), buffers->back().data(), static_cast<int64_t>(buffers->back().size())});
    return Error::Ok;
  }

  // The sidecar asset's directory, resolved and kept inside the sidecar dir.
  Error locate_sidecar(const Manifest& manifest, const char* name, std::string* asset_dir, std::string* asset_root)
      const {
    std::string base;
    if (!sidecar_dir(&base)) {
      report("%s ships its asset as a sidecar ('%s'), and no sidecar directory is set; load the .pte with "
          "coreai_partitioner.backends.apple_coreai.runtime.host.load_program(path) (it looks next to the .pte) or set "
          "COREAI_SIDECAR_DIR to the directory holding '%s/'",
          name,
          manifest.path.c_str(),
          manifest.hash.c_str());
      return Error::NotFound;
    }
    std::string real_base;
    if (!real_path(base, &real_base)) {
      report("%s: the sidecar directory '%s' does not exist; copy the asset directory '%s/' there or "
             "point COREAI_SIDECAR_DIR at it", name, base.c_str(), manifest.hash.c_str());
      return Error::NotFound;
    }
    std::string real_asset;
    if (!real_path(real_base + "/" + manifest.path, &real_asset)) {
      report("%s: sidecar asset '%s' not found in '%s'; ship the '%s/' directory beside the .pte (or set "
          "COREAI_SIDECAR_DIR to where it is)",
          name,
          manifest.path.c_str(),
          real_base.c_str(),
          manifest.hash.c_str());
      return Error::NotFound;
    }
    std::string real_root;
    if (!real_path(real_base + "/" + manifest.hash, &real_root) || !is_inside(real_root, real_base) ||
        !is_inside(real_asset, real_root)) {
      report("%s: sidecar asset '%s' resolves to '%s', outside the sidecar directory '%s'; refusing it",
             name, manifest.path.c_str(), real_asset.c_str(), real_base.c_str());
      return Error::InvalidProgram;
    }
    struct stat info;
    if (::stat(real_asset.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
      report("%s: sidecar asset '%s' is not a directory; ship the whole '%s/' directory", name,
             real_asset.c_str(), manifest.hash.c_str());
      return Error::InvalidProgram;
    }
    for (const InitialState& state : manifest.initial_state) {
      std::string real_file;
      if (!real_path(real_root + "/" + state.file, &real_file) || !is_inside(real_file, real_root) ||
          ::stat(real_file.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) {
        report("%s: the initial value of state '%s' ('%s') is missing from the sidecar directory '%s' "
               "or leaves it; ship the whole '%s/' directory", name, state.name.c_str(), state.file.c_str(),
               real_root.c_str(), manifest.hash.c_str());
        return Error::NotFound;
      }
      Error status = check_initial_state(state, static_cast<uint64_t>(info.st_size), name);
      if (status != Error::Ok) {
        return status;
      }
    }
    *asset_dir = real_asset;
    *asset_root = real_root;
    return Error::Ok;
  }

  /* What tells one loaded program from another, whichever of its methods asks: its named data keys are one
   * object per loaded program, and a method's map (merged with a .ptd's per method) hands out the same key
   * strings; a map with no keys is its own identity. */
  static const void* program_identity(const NamedDataMap* named_data) {
    if (named_data == nullptr) {
      return nullptr;
    }
    auto count = named_data->get_num_keys();
    if (count.ok() && count.get() > 0) {
      auto key = named_data->get_key(0);
      if (key.ok()) {
        return key.get();
      }
    }
    return named_data;
  }

  static Error check_initial_state(const InitialState& state, uint64_t file_bytes, const char* name) {
    size_t element = element_size(state.dtype);
    uint64_t expected = 0;
    if (element == 0 || !byte_size(state.shape, element, &expected) || expected != file_bytes) {
      report("%s: the initial value of state '%s' has %llu bytes, its manifest entry (%s, rank %zu) "
             "disagrees; the .pte or its sidecar is corrupt, export it again", name, state.name.c_str(),
             static_cast<unsigned long long>(file_bytes), state.dtype.c_str(), state.shape.size());
      return Error::InvalidProgram;
    }
    return Error::Ok;
  }

  static Error check_input(const CoreAIDelegate& delegate, size_t index, const EValue& value, CoreAIHostTensor* out) {
    const char* name = delegate.name.c_str();
    const CoreAIHostTensor& expected = delegate.input_signature[index];
    if (!value.isTensor()) {
      report("%s: input %zu is not a tensor (tag %d); pass a %s tensor", name, index,
             static_cast<int>(value.tag), dtype_name(expected.dtype));
      return Error::InvalidArgument;
    }
    const Tensor& tensor = value.toTensor();
    if (static_cast<int32_t>(tensor.scalar_type()) != expected.dtype) {
      report("%s: input %zu is %s, the delegate takes %s; pass the dtype the model was exported with",
             name, index, dtype_name(static_cast<int32_t>(tensor.scalar_type())), dtype_name(expected.dtype));
      return Error::InvalidArgument;
    }
    if (tensor.dim() != expected.rank) {
      report("%s: input %zu has rank %zd, the delegate takes rank %d; pass the shape the model was "
             "exported with", name, index, static_cast<ssize_t>(tensor.dim()), expected.rank);
      return Error::InvalidArgument;
    }
    out->data = tensor.mutable_data_ptr();
    out->nbytes = static_cast<int64_t>(tensor.nbytes());
    out->dtype = expected.dtype;
    out->rank = expected.rank;
    for (int32_t d = 0; d < expected.rank; ++d) {
      int64_t size = tensor.size(d);
      if (expected.sizes[d] >= 0 ? size != expected.sizes[d] : size < 0) {
        report("%s: input %zu has size %lld in dimension %d, the delegate takes %lld; pass the shape "
               "the model was exported with", name, index, static_cast<long long>(size), d,
               static_cast<long long>(expected.sizes[d]));
        return Error::InvalidArgument;
      }
      out->sizes[d] = size;
      out->strides[d] = tensor.strides()[d];
    }
    if (out->data == nullptr && out->nbytes > 0) {
      report("%s: input %zu has no data", name, index);
      return Error::InvalidArgument;
    }
    return Error::Ok;
  }

  static Error copy_output(const CoreAIDelegate& delegate, size_t index, const CoreAIHostTensor& result, Tensor out) {
    const char* name = delegate.name.c_str();
    if (result.dtype != static_cast<int32_t>(out.scalar_type()) || result.rank != out.dim() || result.rank < 0 ||
        result.rank > COREAI_HOST_MAX_RANK) {
      report("%s: output %zu came back as %s of rank %d, the method expects %s of rank %zd; the .pte "
             "does not match its asset, export it again", name, index, dtype_name(result.dtype), result.rank,
             dtype_name(static_cast<int32_t>(out.scalar_type())), static_cast<ssize_t>(out.dim()));
      return Error::InvalidState;
    }
    bool same_shape = true;
    for (int32_t d = 0; d < result.rank; ++d) {
      same_shape = same_shape && out.size(d) == result.sizes[d];
    }
    if (!same_shape) {
      SizesType sizes[COREAI_HOST_MAX_RANK];
      for (int32_t d = 0; d < result.rank; ++d) {
        if (result.sizes[d] < 0 || result.sizes[d] > INT32_MAX) {
          report("%s: output %zu has a size out of bounds", name, index);
          return Error::InvalidState;
        }
        sizes[d] = static_cast<SizesType>(result.sizes[d]);
      }
      Error status = executorch::runtime::resize_tensor(out, {sizes, static_cast<size_t>(result.rank)});
      if (status != Error::Ok) {
        report("%s: output %zu cannot take the delegate's result shape (it exceeds the bound the method "
               "was planned for, or the output is static); export with a larger bound", name, index);
        return status;
      }
    }
    if (static_cast<int64_t>(out.nbytes()) != result.nbytes || (result.nbytes > 0 && result.data == nullptr)) {
      report("%s: output %zu has %lld bytes, the method's output %zu", name, index,
             static_cast<long long>(result.nbytes), static_cast<size_t>(out.nbytes()));
      return Error::InvalidState;
    }
    if (result.nbytes > 0) {
      if (executorch::runtime::is_contiguous_dim_order(out.dim_order().data(), out.dim())) {
        std::memcpy(out.mutable_data_ptr(), result.data, static_cast<size_t>(result.nbytes));
      } else {
        copy_into_dim_order(static_cast<const char*>(result.data), out);
      }
    }
    return Error::Ok;
  }

  // Copies a contiguous result into an output laid out in another dim order.
  static void copy_into_dim_order(const char* source, Tensor out) {
    const size_t element = out.element_size();
    const ssize_t rank = out.dim();
    char* destination = static_cast<char*>(out.mutable_data_ptr());
    int64_t index[COREAI_HOST_MAX_RANK] = {0};
    const ssize_t count = out.numel();
    for (ssize_t n = 0; n < count; ++n) {
      int64_t offset = 0;
      for (ssize_t d = 0; d < rank; ++d) {
        offset += index[d] * out.strides()[d];
      }
      std::memcpy(destination + offset * element, source + n * element, element);
      for (ssize_t d = rank - 1; d >= 0; --d) {
        if (++index[d] < out.size(d)) {
          break;
        }
        index[d] = 0;
      }
    }
  }
};

namespace {
CoreAIHostBackend composite_backend("CoreAICompositeBackend");
CoreAIHostBackend upstream_backend("CoreAIBackend");
Backend composite_registration{"CoreAICompositeBackend", &composite_backend};
Backend upstream_registration{"CoreAIBackend", &upstream_backend};
const Error composite_registered = executorch::ET_RUNTIME_NAMESPACE::register_backend(composite_registration);
const Error upstream_registered = executorch::ET_RUNTIME_NAMESPACE::register_backend(upstream_registration);
} // namespace

} // namespace coreai_host
} // namespace backends
} // namespace executorch

extern "C" {

__attribute__((visibility("default"))) int32_t coreai_host_set_callbacks(
    coreai_host_load_fn load,
    coreai_host_signature_fn signature,
    coreai_host_run_fn run,
    coreai_host_release_fn release) {
  using namespace executorch::backends::coreai_host;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_callbacks = Callbacks{load, signature, run, release};
  return COREAI_HOST_ABI_VERSION;
}

__attribute__((visibility("default"))) void coreai_host_set_sidecar_dir(const char* directory) {
  using namespace executorch::backends::coreai_host;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_sidecar_dir_set = directory != nullptr;
  g_sidecar_dir = directory != nullptr ? directory : "";
}

__attribute__((visibility("default"))) const char* coreai_host_last_error(void) {
  return executorch::backends::coreai_host::t_last_error;
}

__attribute__((visibility("default"))) void coreai_host_clear_last_error(void) {
  executorch::backends::coreai_host::t_last_error[0] = '\0';
}

__attribute__((visibility("default"))) void coreai_host_log_profiling_delegate(
    void* event_tracer, const char* name, int64_t start_ns, int64_t end_ns) {
  using namespace executorch::backends::coreai_host;
  executorch::runtime::event_tracer_log_profiling_delegate(
      static_cast<EventTracer*>(event_tracer),
      name,
      kNamedEvent,
      static_cast<et_timestamp_t>(ns_to_ticks(start_ns) + t_tracer_clock_offset),
      static_cast<et_timestamp_t>(ns_to_ticks(end_ns) + t_tracer_clock_offset));
}

__attribute__((visibility("default"))) int64_t coreai_host_live_delegates(void) {
  return executorch::backends::coreai_host::g_live_delegates.load();
}

__attribute__((visibility("default"))) int32_t coreai_host_registration_status(void) {
  using namespace executorch::backends::coreai_host;
  return static_cast<int32_t>(composite_registered) | (static_cast<int32_t>(upstream_registered) << 8);
}

} // extern "C"
