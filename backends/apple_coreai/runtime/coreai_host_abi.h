/*
 * The C boundary between the Core AI host backend (C++, registered in
 * ExecuTorch's libexecutorch.so) and coreai-core's runtime (Python).
 *
 * host.py, beside this header, mirrors these structs with ctypes and
 * registers the three callbacks with coreai_host_set_callbacks().  The
 * backend never owns Python objects: a delegate is an id on the Python side.
 */
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COREAI_HOST_MAX_RANK 16
#define COREAI_HOST_ABI_VERSION 3

/* A tensor crossing the boundary.  dtype is an ExecuTorch ScalarType code.
 * In a delegate's signature, a size of -1 is a dynamic dimension.  strides
 * (in elements) describe an input's layout, which follows its dim order;
 * outputs come back contiguous and leave them unset. */
typedef struct {
  void* data;
  int64_t nbytes;
  int32_t dtype;
  int32_t rank;
  int64_t sizes[COREAI_HOST_MAX_RANK];
  int64_t strides[COREAI_HOST_MAX_RANK];
} CoreAIHostTensor;

/* One file of an inline asset: its path under <hash>/ and its bytes. */
typedef struct {
  const char* path;
  const void* data;
  int64_t nbytes;
} CoreAIHostFile;

/* Everything a delegate's load needs, validated by the backend.
 * Exactly one of asset_dir (sidecar) and files (inline) is set. */
typedef struct {
  const char* method;
  const char* manifest_json;
  int64_t manifest_nbytes;
  const char* asset_dir;  /* the .aimodel directory, resolved inside the sidecar dir */
  const char* asset_root; /* its <hash>/ directory */
  const CoreAIHostFile* files;
  int64_t num_files;
  /* One value per loaded program (NULL where none can be told): the delegates of one asset in one program
   * share one Core AI state, as the functions of one Core AI program do (forward and verify). */
  const void* program;
} CoreAIHostLoadRequest;

/* Compiles the asset and creates the delegate's state.  Returns an id > 0
 * and writes the number of inputs and outputs, or returns 0 with a message. */
typedef int64_t (*coreai_host_load_fn)(
    const CoreAIHostLoadRequest* request,
    int32_t* num_inputs,
    int32_t* num_outputs,
    char* error,
    int64_t error_capacity);

/* Writes the delegate's input and output signatures.  Returns 0 on success. */
typedef int32_t (*coreai_host_signature_fn)(
    int64_t id,
    CoreAIHostTensor* inputs,
    CoreAIHostTensor* outputs,
    char* error,
    int64_t error_capacity);

/* Runs the delegate once.  The outputs are filled by the callee: data points
 * at memory it keeps alive until its next run or release.  event_tracer is
 * the method's ExecuTorch EventTracer (NULL unless profiling); the callee
 * logs the delegate's own events to it with
 * coreai_host_log_profiling_delegate.  Returns 0 on success. */
typedef int32_t (*coreai_host_run_fn)(
    int64_t id,
    const CoreAIHostTensor* inputs,
    int32_t num_inputs,
    CoreAIHostTensor* outputs,
    int32_t num_outputs,
    void* event_tracer,
    char* error,
    int64_t error_capacity);

typedef void (*coreai_host_release_fn)(int64_t id);

/* Registers the Python side.  Returns COREAI_HOST_ABI_VERSION. */
int32_t coreai_host_set_callbacks(
    coreai_host_load_fn load,
    coreai_host_signature_fn signature,
    coreai_host_run_fn run,
    coreai_host_release_fn release);

/* The directory sidecar assets are read from (NULL: $COREAI_SIDECAR_DIR). */
void coreai_host_set_sidecar_dir(const char* directory);

/* The last error this thread's delegate loads and runs logged ("" if none). */
const char* coreai_host_last_error(void);
void coreai_host_clear_last_error(void);

/* Logs one profiling event of the running delegate to its ExecuTorch
 * EventTracer, by name (a key of the delegate's debug_handle_map); start and
 * end are CLOCK_MONOTONIC_RAW nanoseconds, as coreai-core's profiler stamps them.
 * Call it only from inside the run callback. */
void coreai_host_log_profiling_delegate(void* event_tracer, const char* name, int64_t start_ns, int64_t end_ns);

/* How many delegates are loaded (for tests of destroy). */
int64_t coreai_host_live_delegates(void);

#ifdef __cplusplus
}
#endif
