/* onnxhal's plugin EP library for onnxruntime: the C half of onnxhal.ort_plugin.
 *
 * onnxruntime loads this file's shared library with register_execution_provider_library and calls
 * CreateEpFactories / ReleaseEpFactory. Every call, and every call onnxruntime later makes through
 * the OrtEpFactory / OrtEp / OrtNodeComputeInfo / OrtDataTransferImpl / OrtAllocator / OrtEpProfilerImpl /
 * OrtSyncStreamImpl / OrtSyncNotificationImpl / OrtCustomOp structs that Python builds,
 * lands in one of the small trampolines below, which hands it to one Python dispatcher (a ctypes
 * callback: it takes the GIL on whatever thread onnxruntime calls from). No onnxruntime header is
 * needed: arguments travel as machine words and Python knows their types.
 *
 * Python installs the dispatcher with onnxhal_bridge_attach() and switches it off at interpreter
 * exit with onnxhal_bridge_detach(); from then on every call is refused here (an OrtStatus, or a
 * neutral value for calls that return none), so onnxruntime tearing down after Python has gone
 * never runs Python code.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef struct OrtStatus OrtStatus;
typedef struct OrtApiBase {
  const void* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
} OrtApiBase;
typedef OrtStatus* (*CreateStatusFn)(int code, const char* msg);
typedef uintptr_t (*DispatchFn)(int call, void* self, uintptr_t* args);

enum { ORT_FAIL = 1 };

/* Call ids: the Python side (onnxhal/ort_plugin/dispatch.py) uses the same numbers. */
enum {
  CALL_CREATE_EP_FACTORIES = 1, CALL_RELEASE_EP_FACTORY = 2, CALL_REGISTER_CUSTOM_OPS = 3,
  F_GET_NAME = 10, F_GET_VENDOR, F_GET_SUPPORTED_DEVICES, F_CREATE_EP, F_RELEASE_EP, F_GET_VENDOR_ID,
  F_GET_VERSION, F_VALIDATE_COMPAT, F_CREATE_ALLOCATOR, F_RELEASE_ALLOCATOR, F_CREATE_DATA_TRANSFER,
  F_IS_STREAM_AWARE, F_CREATE_SYNC_STREAM, F_GET_INCOMPATIBILITY_DETAILS, F_GET_NUM_CUSTOM_OP_DOMAINS,
  F_GET_CUSTOM_OP_DOMAINS,
  E_GET_NAME = 30, E_GET_CAPABILITY, E_COMPILE, E_RELEASE_COMPUTE_INFOS, E_GET_LAYOUT, E_SHOULD_CONVERT,
  E_SET_DYNAMIC_OPTIONS, E_ON_RUN_START, E_ON_RUN_END, E_CREATE_ALLOCATOR, E_CREATE_SYNC_STREAM,
  E_GET_COMPAT_INFO, E_SYNC, E_ON_SESSION_INITIALIZATION_END, E_CREATE_PROFILER, E_GET_DEFAULT_MEMORY_DEVICE,
  E_GET_AVAILABLE_RESOURCE,
  C_CREATE_STATE = 50, C_COMPUTE, C_RELEASE_STATE,
  D_RELEASE = 60, D_CAN_COPY, D_COPY_TENSORS,
  A_ALLOC = 70, A_FREE, A_INFO, A_RESERVE,
  P_RELEASE = 80, P_START_PROFILING, P_END_PROFILING,
  S_RELEASE = 90, S_GET_HANDLE, S_CREATE_NOTIFICATION, S_FLUSH, S_ON_SESSION_RUN_END,
  N_RELEASE = 100, N_ACTIVATE, N_WAIT_ON_DEVICE, N_WAIT_ON_HOST,
  O_CREATE_KERNEL = 110, O_GET_NAME, O_GET_EP_TYPE, O_GET_INPUT_TYPE, O_GET_INPUT_TYPE_COUNT, O_GET_OUTPUT_TYPE,
  O_GET_OUTPUT_TYPE_COUNT, O_GET_INPUT_CHARACTERISTIC, O_GET_OUTPUT_CHARACTERISTIC, O_GET_VARIADIC_MIN_ARITY,
  O_GET_VARIADIC_HOMOGENEITY, K_COMPUTE = 130, K_DESTROY,
  G_IS_GRAPH_CAPTURE_ENABLED = 140, G_IS_GRAPH_CAPTURED, G_REPLAY_GRAPH, G_GET_POLICY, G_RELEASE_CAPTURED_GRAPH,
};

static DispatchFn g_dispatch = NULL;
static volatile int g_alive = 0;
static CreateStatusFn g_create_status = NULL;
/* Ctrl-C pressed during a run is raised again when the run's last call (OnRunEnd) is back here,
 * outside Python code, through PyErr_SetInterrupt, which needs no GIL (see interrupts.py). */
typedef void (*InterruptFn)(void);
static InterruptFn g_interrupt = NULL;
static volatile int g_interrupt_pending = 0;

void onnxhal_bridge_set_interrupt(InterruptFn fn) { g_interrupt = fn; }

void onnxhal_bridge_interrupt_after_call(void) { g_interrupt_pending = 1; }

static uintptr_t after_call(uintptr_t result) {
  if (g_interrupt_pending) {
    g_interrupt_pending = 0;
    if (g_interrupt != NULL) g_interrupt();
  }
  return result;
}

void onnxhal_bridge_attach(DispatchFn dispatch) {
  g_dispatch = dispatch;
  g_alive = 1;
}

void onnxhal_bridge_detach(void) { g_alive = 0; }

int onnxhal_bridge_alive(void) { return g_alive && g_dispatch != NULL; }

static OrtStatus* refused(void) {
  if (g_create_status == NULL) return NULL; /* cannot happen after CreateEpFactories */
  return g_create_status(ORT_FAIL,
                         "onnxhal: the Python interpreter that runs this EP has shut down (or onnxhal.ort_plugin "
                         "was not imported in this process); call onnxhal.ort_plugin.library_path() before "
                         "registering the library, and end sessions before the interpreter exits");
}

#define W(x) ((uintptr_t)(x))
#define STATUS_CALL(id, self, ...)                                     \
  do {                                                                 \
    uintptr_t a_[] = {0, __VA_ARGS__};                                 \
    if (!onnxhal_bridge_alive()) return refused();                     \
    return (OrtStatus*)after_call(g_dispatch((id), (void*)(self), a_ + 1)); \
  } while (0)
#define VALUE_CALL(type, fallback, id, self, ...)                      \
  do {                                                                 \
    uintptr_t a_[] = {0, __VA_ARGS__};                                 \
    if (!onnxhal_bridge_alive()) return (fallback);                    \
    return (type)g_dispatch((id), (void*)(self), a_ + 1);              \
  } while (0)
#define VOID_CALL(id, self, ...)                                       \
  do {                                                                 \
    uintptr_t a_[] = {0, __VA_ARGS__};                                 \
    if (onnxhal_bridge_alive()) g_dispatch((id), (void*)(self), a_ + 1); \
  } while (0)

/* ---- library entry points ---------------------------------------------------------------- */
OrtStatus* CreateEpFactories(const char* registered_name, const OrtApiBase* api_base, const void* logger,
                             void** factories, size_t max_factories, size_t* num_factories) {
  if (g_create_status == NULL && api_base != NULL) {
    /* Slot 0 of every OrtApi version is CreateStatus; version 1 exists in every onnxruntime. */
    const void* const* api = (const void* const*)api_base->GetApi(1);
    if (api != NULL) g_create_status = (CreateStatusFn)api[0];
  }
  *num_factories = 0;
  STATUS_CALL(CALL_CREATE_EP_FACTORIES, NULL, W(registered_name), W(api_base), W(logger), W(factories),
              W(max_factories), W(num_factories));
}

OrtStatus* ReleaseEpFactory(void* factory) {
  if (!onnxhal_bridge_alive()) return NULL; /* nothing to free on the C side */
  return (OrtStatus*)g_dispatch(CALL_RELEASE_EP_FACTORY, factory, NULL);
}

/* onnxruntime's custom-op library entry point (SessionOptions.register_custom_ops_library): the
 * registered factories' custom-op domains into one session's options (custom_ops.py). */
OrtStatus* RegisterCustomOps(void* options, const OrtApiBase* api_base) {
  if (g_create_status == NULL && api_base != NULL) {
    const void* const* api = (const void* const*)api_base->GetApi(1);
    if (api != NULL) g_create_status = (CreateStatusFn)api[0];
  }
  STATUS_CALL(CALL_REGISTER_CUSTOM_OPS, NULL, W(options), W(api_base));
}

/* ---- OrtEpFactory ------------------------------------------------------------------------ */
const char* f_get_name(const void* self) { VALUE_CALL(const char*, "", F_GET_NAME, self, 0); }
const char* f_get_vendor(const void* self) { VALUE_CALL(const char*, "", F_GET_VENDOR, self, 0); }
OrtStatus* f_get_supported_devices(void* self, const void* const* devices, size_t num_devices, void** ep_devices,
                                   size_t max_ep_devices, size_t* num_ep_devices) {
  *num_ep_devices = 0;
  STATUS_CALL(F_GET_SUPPORTED_DEVICES, self, W(devices), W(num_devices), W(ep_devices), W(max_ep_devices),
              W(num_ep_devices));
}
OrtStatus* f_create_ep(void* self, const void* const* devices, const void* const* ep_metadata, size_t num_devices,
                       const void* session_options, const void* logger, void** ep) {
  *ep = NULL;
  STATUS_CALL(F_CREATE_EP, self, W(devices), W(ep_metadata), W(num_devices), W(session_options), W(logger), W(ep));
}
void f_release_ep(void* self, void* ep) { VOID_CALL(F_RELEASE_EP, self, W(ep)); }
uint32_t f_get_vendor_id(const void* self) { VALUE_CALL(uint32_t, 0, F_GET_VENDOR_ID, self, 0); }
const char* f_get_version(const void* self) { VALUE_CALL(const char*, "0.0.0", F_GET_VERSION, self, 0); }
OrtStatus* f_validate_compat(void* self, const void* const* devices, size_t num_devices, const char* info,
                             int* compatibility) {
  STATUS_CALL(F_VALIDATE_COMPAT, self, W(devices), W(num_devices), W(info), W(compatibility));
}
OrtStatus* f_create_allocator(void* self, const void* memory_info, const void* options, void** allocator) {
  *allocator = NULL;
  STATUS_CALL(F_CREATE_ALLOCATOR, self, W(memory_info), W(options), W(allocator));
}
void f_release_allocator(void* self, void* allocator) { VOID_CALL(F_RELEASE_ALLOCATOR, self, W(allocator)); }
OrtStatus* f_create_data_transfer(void* self, void** data_transfer) {
  *data_transfer = NULL;
  STATUS_CALL(F_CREATE_DATA_TRANSFER, self, W(data_transfer));
}
bool f_is_stream_aware(const void* self) { VALUE_CALL(bool, false, F_IS_STREAM_AWARE, self, 0); }
OrtStatus* f_create_sync_stream(void* self, const void* memory_device, const void* options, void** stream) {
  *stream = NULL;
  STATUS_CALL(F_CREATE_SYNC_STREAM, self, W(memory_device), W(options), W(stream));
}
OrtStatus* f_get_incompatibility_details(void* self, const void* hardware_device, void* details) {
  STATUS_CALL(F_GET_INCOMPATIBILITY_DETAILS, self, W(hardware_device), W(details));
}
OrtStatus* f_get_num_custom_op_domains(void* self, size_t* num_domains) {
  *num_domains = 0;
  STATUS_CALL(F_GET_NUM_CUSTOM_OP_DOMAINS, self, W(num_domains));
}
OrtStatus* f_get_custom_op_domains(void* self, void** domains, size_t num_domains) {
  STATUS_CALL(F_GET_CUSTOM_OP_DOMAINS, self, W(domains), W(num_domains));
}

/* ---- OrtEp -------------------------------------------------------------------------------- */
const char* e_get_name(const void* self) { VALUE_CALL(const char*, "", E_GET_NAME, self, 0); }
OrtStatus* e_get_capability(void* self, const void* graph, void* support_info) {
  STATUS_CALL(E_GET_CAPABILITY, self, W(graph), W(support_info));
}
OrtStatus* e_compile(void* self, const void** graphs, const void** fused_nodes, size_t count, void** compute_infos,
                     void** ep_context_nodes) {
  STATUS_CALL(E_COMPILE, self, W(graphs), W(fused_nodes), W(count), W(compute_infos), W(ep_context_nodes));
}
void e_release_compute_infos(void* self, void** compute_infos, size_t count) {
  VOID_CALL(E_RELEASE_COMPUTE_INFOS, self, W(compute_infos), W(count));
}
OrtStatus* e_get_layout(void* self, int* layout) { STATUS_CALL(E_GET_LAYOUT, self, W(layout)); }
OrtStatus* e_should_convert(void* self, const char* domain, const char* op_type, int target_layout,
                            int* should_convert) {
  STATUS_CALL(E_SHOULD_CONVERT, self, W(domain), W(op_type), W((intptr_t)target_layout), W(should_convert));
}
OrtStatus* e_set_dynamic_options(void* self, const char* const* keys, const char* const* values, size_t count) {
  STATUS_CALL(E_SET_DYNAMIC_OPTIONS, self, W(keys), W(values), W(count));
}
OrtStatus* e_on_run_start(void* self, const void* run_options) { STATUS_CALL(E_ON_RUN_START, self, W(run_options)); }
OrtStatus* e_on_run_end(void* self, const void* run_options, bool sync_stream) {
  STATUS_CALL(E_ON_RUN_END, self, W(run_options), W(sync_stream ? 1 : 0));
}
OrtStatus* e_create_allocator(void* self, const void* memory_info, void** allocator) {
  *allocator = NULL;
  STATUS_CALL(E_CREATE_ALLOCATOR, self, W(memory_info), W(allocator));
}
/* OrtEp::CreateSyncStreamForDevice answers here, without Python (see "Session streams" below). */
OrtStatus* e_create_sync_stream(void* self, const void* memory_device, void** stream);
const char* e_get_compat_info(void* self, const void* graph) {
  VALUE_CALL(const char*, "", E_GET_COMPAT_INFO, self, W(graph));
}
OrtStatus* e_sync(void* self) { STATUS_CALL(E_SYNC, self, 0); }
OrtStatus* e_on_session_initialization_end(void* self) { STATUS_CALL(E_ON_SESSION_INITIALIZATION_END, self, 0); }
OrtStatus* e_create_profiler(void* self, void** profiler) {
  *profiler = NULL;
  STATUS_CALL(E_CREATE_PROFILER, self, W(profiler));
}
OrtStatus* e_get_default_memory_device(const void* self, const void** device) {
  *device = NULL;
  STATUS_CALL(E_GET_DEFAULT_MEMORY_DEVICE, self, W(device));
}
/* available: onnxruntime's OrtResourceCount, filled in adapter.py. */
OrtStatus* e_get_available_resource(const void* self, void* available) {
  STATUS_CALL(E_GET_AVAILABLE_RESOURCE, self, W(available));
}

/* Graph capture (graph_capture.py); a graph annotation id travels sign-extended. */
bool e_is_graph_capture_enabled(const void* self) { VALUE_CALL(bool, false, G_IS_GRAPH_CAPTURE_ENABLED, self, 0); }
bool e_is_graph_captured(const void* self, int graph_annotation_id) {
  VALUE_CALL(bool, false, G_IS_GRAPH_CAPTURED, self, W((intptr_t)graph_annotation_id));
}
OrtStatus* e_replay_graph(void* self, int graph_annotation_id) {
  STATUS_CALL(G_REPLAY_GRAPH, self, W((intptr_t)graph_annotation_id));
}
/* OrtGraphCaptureNodeAssignmentPolicy; 0 (ALL_NODES_ON_EP, onnxruntime's default) once Python is gone. */
int e_get_graph_capture_policy(const void* self) { VALUE_CALL(int, 0, G_GET_POLICY, self, 0); }
OrtStatus* e_release_captured_graph(void* self, int graph_annotation_id) {
  STATUS_CALL(G_RELEASE_CAPTURED_GRAPH, self, W((intptr_t)graph_annotation_id));
}

/* ---- OrtCustomOp (custom_ops.py) and its kernels -------------------------------------------- */
/* The schema answers are the same for every input and output index: Python gets the index anyway. */
void* o_create_kernel_v1(const void* self, const void* api, const void* info) {
  (void)self; (void)api; (void)info;
  return NULL; /* onnxruntime uses CreateKernelV2 (the struct declares version 16) */
}
OrtStatus* o_create_kernel(const void* self, const void* api, const void* info, void** kernel) {
  *kernel = NULL;
  STATUS_CALL(O_CREATE_KERNEL, self, W(api), W(info), W(kernel));
}
const char* o_get_name(const void* self) { VALUE_CALL(const char*, "", O_GET_NAME, self, 0); }
const char* o_get_ep_type(const void* self) { VALUE_CALL(const char*, NULL, O_GET_EP_TYPE, self, 0); }
int o_get_input_type(const void* self, size_t index) { VALUE_CALL(int, 0, O_GET_INPUT_TYPE, self, W(index)); }
size_t o_get_input_type_count(const void* self) { VALUE_CALL(size_t, 0, O_GET_INPUT_TYPE_COUNT, self, 0); }
int o_get_output_type(const void* self, size_t index) { VALUE_CALL(int, 0, O_GET_OUTPUT_TYPE, self, W(index)); }
size_t o_get_output_type_count(const void* self) { VALUE_CALL(size_t, 0, O_GET_OUTPUT_TYPE_COUNT, self, 0); }
int o_get_input_characteristic(const void* self, size_t index) {
  VALUE_CALL(int, 0, O_GET_INPUT_CHARACTERISTIC, self, W(index));
}
int o_get_output_characteristic(const void* self, size_t index) {
  VALUE_CALL(int, 0, O_GET_OUTPUT_CHARACTERISTIC, self, W(index));
}
int o_get_input_memory_type(const void* self, size_t index) {
  (void)self; (void)index;
  return 0; /* OrtMemTypeDefault: inputs where the op's EP keeps them */
}
int o_get_variadic_min_arity(const void* self) { VALUE_CALL(int, 1, O_GET_VARIADIC_MIN_ARITY, self, 0); }
int o_get_variadic_homogeneity(const void* self) { VALUE_CALL(int, 0, O_GET_VARIADIC_HOMOGENEITY, self, 0); }
void k_compute_v1(void* kernel, void* context) { (void)kernel; (void)context; }
OrtStatus* k_compute(void* kernel, void* context) { STATUS_CALL(K_COMPUTE, kernel, W(context)); }
void k_destroy(void* kernel) { VOID_CALL(K_DESTROY, kernel, 0); }

/* ---- OrtEpProfilerImpl (StartEvent / StopEvent stay NULL: onnxruntime skips them then) ------- */
/* The clock of onnxruntime's profiler: it times events with std::chrono::high_resolution_clock, which
 * libstdc++ (onnxruntime's Linux builds) makes the system clock. Read here, not in Python, so that
 * the time a call waits for the GIL never shifts an event against onnxruntime's. */
int64_t onnxhal_bridge_clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
void p_release(void* self) { VOID_CALL(P_RELEASE, self, 0); }
/* Python gets onnxruntime's profiling start on onnxhal_bridge_clock_ns's scale, fixed on entry. */
OrtStatus* p_start_profiling(void* self, int64_t start_offset_ns) {
  int64_t start = onnxhal_bridge_clock_ns() - start_offset_ns;
  STATUS_CALL(P_START_PROFILING, self, W((intptr_t)start));
}
OrtStatus* p_end_profiling(void* self, void* events_container) {
  STATUS_CALL(P_END_PROFILING, self, W(events_container));
}

/* ---- OrtNodeComputeInfo ------------------------------------------------------------------- */
OrtStatus* c_create_state(void* self, void* compute_context, void** state) {
  *state = NULL;
  STATUS_CALL(C_CREATE_STATE, self, W(compute_context), W(state));
}
/* The third word is the call's start on onnxhal_bridge_clock_ns's scale, for the profiler's event. */
OrtStatus* c_compute(void* self, void* state, void* kernel_context) {
  int64_t start = onnxhal_bridge_clock_ns();
  STATUS_CALL(C_COMPUTE, self, W(state), W(kernel_context), W((intptr_t)start));
}
void c_release_state(void* self, void* state) { VOID_CALL(C_RELEASE_STATE, self, W(state)); }

/* ---- OrtDataTransferImpl ------------------------------------------------------------------ */
void d_release(void* self) { VOID_CALL(D_RELEASE, self, 0); }
bool d_can_copy(const void* self, const void* src_device, const void* dst_device) {
  VALUE_CALL(bool, false, D_CAN_COPY, self, W(src_device), W(dst_device));
}
OrtStatus* d_copy_tensors(void* self, const void** src, void** dst, void** streams, size_t count) {
  STATUS_CALL(D_COPY_TENSORS, self, W(src), W(dst), W(streams), W(count));
}

/* ---- OrtAllocator ------------------------------------------------------------------------- */
void* a_alloc(void* self, size_t size) { VALUE_CALL(void*, NULL, A_ALLOC, self, W(size)); }
void a_free(void* self, void* p) { VOID_CALL(A_FREE, self, W(p)); }
const void* a_info(const void* self) { VALUE_CALL(const void*, NULL, A_INFO, self, 0); }
void* a_reserve(void* self, size_t size) { VALUE_CALL(void*, NULL, A_RESERVE, self, W(size)); }

/* ---- OrtSyncStreamImpl / OrtSyncNotificationImpl (streams.py) ------------------------------ */
/* ---- Session streams, made without Python ------------------------------------------------
 * onnxruntime asks an EP for its session streams while it holds the session's stream-pool mutex
 * (SessionState::AcquireDeviceStreamCollection, onnxruntime/core/framework/session_state.cc), also
 * from IOBinding::BindInput, which its Python binding calls holding the GIL. Python code run under
 * that mutex can lose the GIL (a ctypes call, the interpreter's switch interval) to a thread that
 * then waits for the mutex holding the GIL: a deadlock. So the stream is made here: a C struct
 * whose hal stream Python makes at its first call that needs one (streams.py, LazyStream), which
 * onnxruntime makes outside that mutex. Python registers, per EP, the memory devices it gives
 * streams for, and the OrtEpApi getters that read an OrtMemoryDevice. */
typedef int (*MemoryDeviceFn)(const void*);
enum { MAX_STREAM_DEVICES = 8 };
typedef struct StreamEp {
  const void* ep;
  int count;
  int64_t devices[MAX_STREAM_DEVICES][4]; /* device type, memory type, vendor id, device id */
  struct StreamEp* next;
} StreamEp;
typedef struct LazyStream {
  /* OrtSyncStreamImpl (API 23): version, Release, GetHandle, CreateNotification, Flush, OnSessionRunEnd */
  uint32_t ort_version_supported;
  void* fns[5];
  const void* ep;
  int64_t device[4];
  struct LazyStream* next;
} LazyStream;
static pthread_mutex_t g_stream_lock = PTHREAD_MUTEX_INITIALIZER;
static StreamEp* g_stream_eps = NULL;
static LazyStream* g_lazy_streams = NULL;
static MemoryDeviceFn g_md_fns[4] = {NULL, NULL, NULL, NULL};

void onnxhal_bridge_set_memory_device_getters(MemoryDeviceFn device_type, MemoryDeviceFn memory_type,
                                              MemoryDeviceFn vendor_id, MemoryDeviceFn device_id) {
  g_md_fns[0] = device_type; g_md_fns[1] = memory_type; g_md_fns[2] = vendor_id; g_md_fns[3] = device_id;
}

/* devices: count rows of 4 (device type, memory type, vendor id, device id); count 0 unregisters. */
int onnxhal_bridge_set_stream_devices(const void* ep, const int64_t* devices, int count) {
  if (count > MAX_STREAM_DEVICES) return -1;
  pthread_mutex_lock(&g_stream_lock);
  StreamEp** at = &g_stream_eps;
  while (*at != NULL && (*at)->ep != ep) at = &(*at)->next;
  StreamEp* entry = *at;
  if (count == 0) {
    if (entry != NULL) { *at = entry->next; free(entry); }
    pthread_mutex_unlock(&g_stream_lock);
    return 0;
  }
  if (entry == NULL) {
    entry = calloc(1, sizeof *entry);
    if (entry == NULL) { pthread_mutex_unlock(&g_stream_lock); return -1; }
    entry->ep = ep;
    *at = entry;
  }
  entry->count = count;
  for (int i = 0; i < count; ++i)
    for (int j = 0; j < 4; ++j) entry->devices[i][j] = devices[4 * i + j];
  pthread_mutex_unlock(&g_stream_lock);
  return 0;
}

void s_release(void* self);
void* s_get_handle(void* self);
OrtStatus* s_create_notification(void* self, void** notification);
OrtStatus* s_flush(void* self);
OrtStatus* s_on_session_run_end(void* self);

OrtStatus* e_create_sync_stream(void* self, const void* memory_device, void** stream) {
  *stream = NULL;
  if (!onnxhal_bridge_alive()) return refused();
  if (g_md_fns[0] == NULL || memory_device == NULL) return NULL;
  int64_t key[4];
  for (int j = 0; j < 4; ++j) key[j] = g_md_fns[j](memory_device);
  key[2] = (int64_t)(uint32_t)key[2]; /* the vendor id is a uint32_t */
  LazyStream* made = NULL;
  int declared = 0;
  pthread_mutex_lock(&g_stream_lock);
  StreamEp* entry = g_stream_eps;
  while (entry != NULL && entry->ep != self) entry = entry->next;
  for (int i = 0; entry != NULL && i < entry->count && made == NULL; ++i) {
    if (entry->devices[i][0] != key[0] || entry->devices[i][1] != key[1] || entry->devices[i][2] != key[2] ||
        entry->devices[i][3] != key[3])
      continue;
    declared = 1;
    made = calloc(1, sizeof *made);
    if (made == NULL) break;
    made->ort_version_supported = 23;
    made->fns[0] = (void*)s_release; made->fns[1] = (void*)s_get_handle;
    made->fns[2] = (void*)s_create_notification; made->fns[3] = (void*)s_flush;
    made->fns[4] = (void*)s_on_session_run_end;
    made->ep = self;
    for (int j = 0; j < 4; ++j) made->device[j] = key[j];
    made->next = g_lazy_streams;
    g_lazy_streams = made;
  }
  pthread_mutex_unlock(&g_stream_lock);
  if (declared && made == NULL && g_create_status != NULL)
    return g_create_status(ORT_FAIL, "onnxhal: out of memory making a sync stream");
  *stream = made;
  return NULL;
}

/* For Python: whether p is a live stream made above, with its EP and memory device (4 words). */
int onnxhal_bridge_lazy_stream(const void* p, const void** ep, int64_t* device) {
  int found = 0;
  pthread_mutex_lock(&g_stream_lock);
  for (LazyStream* s = g_lazy_streams; s != NULL; s = s->next) {
    if (s != p) continue;
    *ep = s->ep;
    for (int j = 0; j < 4; ++j) device[j] = s->device[j];
    found = 1;
    break;
  }
  pthread_mutex_unlock(&g_stream_lock);
  return found;
}

static void free_lazy_stream(void* p) {
  pthread_mutex_lock(&g_stream_lock);
  for (LazyStream** at = &g_lazy_streams; *at != NULL; at = &(*at)->next) {
    if (*at != p) continue;
    LazyStream* s = *at;
    *at = s->next;
    free(s);
    break;
  }
  pthread_mutex_unlock(&g_stream_lock);
}

void s_release(void* self) {
  VOID_CALL(S_RELEASE, self, 0);
  free_lazy_stream(self);
}
/* The handle is the stream struct's own address (streams.py): no Python needed. */
void* s_get_handle(void* self) { return self; }
OrtStatus* s_create_notification(void* self, void** notification) {
  *notification = NULL;
  STATUS_CALL(S_CREATE_NOTIFICATION, self, W(notification));
}
OrtStatus* s_flush(void* self) { STATUS_CALL(S_FLUSH, self, 0); }
OrtStatus* s_on_session_run_end(void* self) { STATUS_CALL(S_ON_SESSION_RUN_END, self, 0); }
void n_release(void* self) { VOID_CALL(N_RELEASE, self, 0); }
OrtStatus* n_activate(void* self) { STATUS_CALL(N_ACTIVATE, self, 0); }
OrtStatus* n_wait_on_device(void* self, void* consumer_stream) {
  STATUS_CALL(N_WAIT_ON_DEVICE, self, W(consumer_stream));
}
OrtStatus* n_wait_on_host(void* self) { STATUS_CALL(N_WAIT_ON_HOST, self, 0); }
