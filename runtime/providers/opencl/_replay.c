/* The OpenCL EP's optional native replay (onnxhal.runtime.providers.opencl._replay): a partition's
 * recorded launches and copies enqueued by one call, with clSetKernelArg only for the arguments
 * whose buffer changed since the kernel last held one (partition_plan.py's _replay_step, in C).
 *
 * Nothing is linked at build time and no OpenCL header is needed: `load(path)` opens the OpenCL
 * library that pyopencl loaded and takes three entry points from it. pyopencl's objects are ICD
 * objects (their first field is the driver's dispatch table), so any ICD loader's entry points
 * dispatch them to the driver that made them. The prototypes and constants below are written from
 * the Khronos OpenCL headers (CL/cl.h, CL/cl_platform.h of OpenCL-Headers: cl_int is int32_t,
 * cl_uint uint32_t, handles are pointers to opaque structs, CL_SUCCESS is 0).
 *
 * A recording holds, per launch, its kernel (the pyopencl object, kept alive, and its handle), its
 * NDRange, and the (argument index, slot) pairs that a run sets; per copy, its two slots and size.
 * A run passes one sequence of pyopencl Buffers, one per slot. Which buffer each argument holds is
 * kept as the pyopencl object (a strong reference, as the Python path keeps it): comparing objects,
 * not cl_mem values, means a released buffer whose handle a new buffer reuses is never mistaken for
 * the one still bound.
 *
 * Python's C API only; the OpenCL calls run with the GIL released. A recording is not safe to replay
 * from two threads at once: its caller holds the partition state's lock.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifdef _WIN32
#include <windows.h>
#define CL_API_CALL __stdcall
#else
#include <dlfcn.h>
#define CL_API_CALL
#endif

typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef void *cl_handle; /* cl_kernel, cl_command_queue, cl_mem, cl_event: pointers to opaque structs */

#define CL_SUCCESS 0

typedef cl_int(CL_API_CALL *SetKernelArgFn)(cl_handle kernel, cl_uint arg_index, size_t arg_size,
                                            const void *arg_value);
typedef cl_int(CL_API_CALL *EnqueueNDRangeKernelFn)(cl_handle queue, cl_handle kernel, cl_uint work_dim,
                                                    const size_t *global_work_offset, const size_t *global_work_size,
                                                    const size_t *local_work_size, cl_uint num_events_in_wait_list,
                                                    const cl_handle *event_wait_list, cl_handle *event);
typedef cl_int(CL_API_CALL *EnqueueCopyBufferFn)(cl_handle queue, cl_handle src_buffer, cl_handle dst_buffer,
                                                 size_t src_offset, size_t dst_offset, size_t size,
                                                 cl_uint num_events_in_wait_list, const cl_handle *event_wait_list,
                                                 cl_handle *event);

typedef cl_int(CL_API_CALL *EnqueueWriteBufferFn)(cl_handle queue, cl_handle buffer, cl_uint blocking_write,
                                                  size_t offset, size_t size, const void *ptr,
                                                  cl_uint num_events_in_wait_list, const cl_handle *event_wait_list,
                                                  cl_handle *event);
typedef cl_int(CL_API_CALL *EnqueueReadBufferFn)(cl_handle queue, cl_handle buffer, cl_uint blocking_read, size_t offset,
                                                 size_t size, void *ptr, cl_uint num_events_in_wait_list,
                                                 const cl_handle *event_wait_list, cl_handle *event);
typedef cl_int(CL_API_CALL *FinishFn)(cl_handle queue);

static SetKernelArgFn set_kernel_arg;
static EnqueueWriteBufferFn enqueue_write_buffer;
static EnqueueReadBufferFn enqueue_read_buffer;
static FinishFn finish;
static EnqueueNDRangeKernelFn enqueue_nd_range_kernel;
static EnqueueCopyBufferFn enqueue_copy_buffer;

/* Commands made, for the benchmark's counts (the Python path is counted by wrapping pyopencl). */
static unsigned long long n_launches, n_copies, n_set_args, n_writes, n_reads, n_finishes;

enum { STEP_LAUNCH = 0, STEP_COPY = 1 };

typedef struct {
  int kind;
  /* launch */
  PyObject *kernel_obj;
  cl_handle kernel;
  cl_uint work_dim;
  size_t global[3];
  size_t local[3];
  int has_local;
  Py_ssize_t first_arg, n_args; /* into Recording.arg_* */
  /* copy */
  Py_ssize_t dst, src;
  size_t nbytes;
} Step;

typedef struct {
  PyObject_HEAD
  Step *steps;
  Py_ssize_t n_steps, n_slots, n_args;
  cl_uint *arg_index;
  Py_ssize_t *arg_slot;
  PyObject **bound;     /* the buffer object each dynamic argument holds (strong), NULL: none yet */
  PyObject **pending;   /* per run: the object set, when the set succeeded (borrowed from the slots) */
  cl_handle *slot_mem;  /* per run: each slot's cl_mem */
} Recording;

static void Recording_dealloc(Recording *self) {
  if (self->steps) {
    for (Py_ssize_t i = 0; i < self->n_steps; i++) Py_XDECREF(self->steps[i].kernel_obj);
  }
  if (self->bound) {
    for (Py_ssize_t i = 0; i < self->n_args; i++) Py_XDECREF(self->bound[i]);
  }
  PyMem_Free(self->steps);
  PyMem_Free(self->arg_index);
  PyMem_Free(self->arg_slot);
  PyMem_Free(self->bound);
  PyMem_Free(self->pending);
  PyMem_Free(self->slot_mem);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int handle_of(PyObject *obj, cl_handle *out) {
  PyObject *ptr = PyObject_GetAttrString(obj, "int_ptr");
  if (!ptr) return -1;
  void *p = PyLong_AsVoidPtr(ptr);
  Py_DECREF(ptr);
  if (!p && PyErr_Occurred()) return -1;
  *out = p;
  return 0;
}

static int sizes(PyObject *seq, size_t out[3], cl_uint *dims, const char *what) {
  PyObject *fast = PySequence_Fast(seq, what);
  if (!fast) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  if (n < 1 || n > 3) {
    Py_DECREF(fast);
    PyErr_Format(PyExc_ValueError, "%s: 1 to 3 dimensions, got %zd", what, n);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    size_t v = PyLong_AsSize_t(PySequence_Fast_GET_ITEM(fast, i));
    if (v == (size_t)-1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return -1;
    }
    out[i] = v;
  }
  Py_DECREF(fast);
  *dims = (cl_uint)n;
  return 0;
}

static Py_ssize_t slot_index(PyObject *o, Py_ssize_t n_slots) {
  Py_ssize_t s = PyLong_AsSsize_t(o);
  if (s == -1 && PyErr_Occurred()) return -1;
  if (s < 0 || s >= n_slots) {
    PyErr_Format(PyExc_ValueError, "slot %zd out of range for %zd slots", s, n_slots);
    return -1;
  }
  return s;
}

/* Recording(steps, n_slots): steps is a sequence of
 *   (0, kernel, global_size, local_size or None, ((arg_index, slot), ...))   a launch
 *   (1, dst_slot, src_slot, nbytes)                                          a buffer copy */
static PyObject *Recording_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
  PyObject *steps_in;
  Py_ssize_t n_slots;
  static char *kwlist[] = {"steps", "n_slots", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "On", kwlist, &steps_in, &n_slots)) return NULL;
  if (n_slots < 0) {
    PyErr_SetString(PyExc_ValueError, "n_slots must be >= 0");
    return NULL;
  }
  PyObject *steps = PySequence_Fast(steps_in, "steps must be a sequence");
  if (!steps) return NULL;
  Recording *self = (Recording *)type->tp_alloc(type, 0);
  if (!self) goto fail;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(steps);
  self->n_slots = n_slots;
  self->steps = PyMem_Calloc(n ? n : 1, sizeof(Step));
  self->slot_mem = PyMem_Calloc(n_slots ? n_slots : 1, sizeof(cl_handle));
  if (!self->steps || !self->slot_mem) {
    PyErr_NoMemory();
    goto fail;
  }
  self->n_steps = n;
  Py_ssize_t total_args = 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *t = PySequence_Fast_GET_ITEM(steps, i);
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 4) {
      PyErr_Format(PyExc_TypeError, "step %zd: expected a tuple of 4 or 5 items", i);
      goto fail;
    }
    if (PyLong_AsLong(PyTuple_GET_ITEM(t, 0)) == STEP_LAUNCH) {
      if (PyTuple_GET_SIZE(t) != 5) {
        PyErr_Format(PyExc_TypeError, "step %zd: a launch is (0, kernel, global, local, dynamic)", i);
        goto fail;
      }
      Py_ssize_t k = PySequence_Size(PyTuple_GET_ITEM(t, 4));
      if (k < 0) goto fail;
      total_args += k;
    }
  }
  if (PyErr_Occurred()) goto fail;
  self->arg_index = PyMem_Calloc(total_args ? total_args : 1, sizeof(cl_uint));
  self->arg_slot = PyMem_Calloc(total_args ? total_args : 1, sizeof(Py_ssize_t));
  self->bound = PyMem_Calloc(total_args ? total_args : 1, sizeof(PyObject *));
  self->pending = PyMem_Calloc(total_args ? total_args : 1, sizeof(PyObject *));
  if (!self->arg_index || !self->arg_slot || !self->bound || !self->pending) {
    PyErr_NoMemory();
    goto fail;
  }
  self->n_args = total_args;
  Py_ssize_t a = 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *t = PySequence_Fast_GET_ITEM(steps, i);
    Step *s = &self->steps[i];
    s->kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
    if (s->kind == STEP_LAUNCH) {
      PyObject *kernel = PyTuple_GET_ITEM(t, 1);
      if (handle_of(kernel, &s->kernel) < 0) goto fail;
      Py_INCREF(kernel);
      s->kernel_obj = kernel;
      if (sizes(PyTuple_GET_ITEM(t, 2), s->global, &s->work_dim, "global size") < 0) goto fail;
      PyObject *local = PyTuple_GET_ITEM(t, 3);
      if (local != Py_None) {
        cl_uint ldims;
        if (sizes(local, s->local, &ldims, "local size") < 0) goto fail;
        if (ldims != s->work_dim) {
          PyErr_Format(PyExc_ValueError, "step %zd: local size has %u dims, global size %u", i, ldims, s->work_dim);
          goto fail;
        }
        s->has_local = 1;
      }
      PyObject *dyn = PySequence_Fast(PyTuple_GET_ITEM(t, 4), "dynamic arguments must be a sequence");
      if (!dyn) goto fail;
      s->first_arg = a;
      s->n_args = PySequence_Fast_GET_SIZE(dyn);
      for (Py_ssize_t j = 0; j < s->n_args; j++, a++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(dyn, j);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
          Py_DECREF(dyn);
          PyErr_Format(PyExc_TypeError, "step %zd: a dynamic argument is (arg_index, slot)", i);
          goto fail;
        }
        long idx = PyLong_AsLong(PyTuple_GET_ITEM(pair, 0));
        Py_ssize_t slot = slot_index(PyTuple_GET_ITEM(pair, 1), n_slots);
        if ((idx == -1 && PyErr_Occurred()) || slot < 0) {
          Py_DECREF(dyn);
          if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad argument index");
          goto fail;
        }
        if (idx < 0) {
          Py_DECREF(dyn);
          PyErr_Format(PyExc_ValueError, "step %zd: argument index %ld < 0", i, idx);
          goto fail;
        }
        self->arg_index[a] = (cl_uint)idx;
        self->arg_slot[a] = slot;
      }
      Py_DECREF(dyn);
    } else if (s->kind == STEP_COPY) {
      if ((s->dst = slot_index(PyTuple_GET_ITEM(t, 1), n_slots)) < 0) goto fail;
      if ((s->src = slot_index(PyTuple_GET_ITEM(t, 2), n_slots)) < 0) goto fail;
      s->nbytes = PyLong_AsSize_t(PyTuple_GET_ITEM(t, 3));
      if (s->nbytes == (size_t)-1 && PyErr_Occurred()) goto fail;
    } else {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "step %zd: kind must be 0 (launch) or 1 (copy)", i);
      goto fail;
    }
  }
  Py_DECREF(steps);
  return (PyObject *)self;
fail:
  Py_DECREF(steps);
  Py_XDECREF(self);
  return NULL;
}

/* Looks up each slot's cl_mem (with the GIL); -1 with an exception set on a bad slot list. */
static int load_slots(Recording *self, PyObject *slots) {
  if (PySequence_Fast_GET_SIZE(slots) != self->n_slots) {
    PyErr_Format(PyExc_ValueError, "expected %zd slots, got %zd", self->n_slots, PySequence_Fast_GET_SIZE(slots));
    return -1;
  }
  PyObject **slot_obj = PySequence_Fast_ITEMS(slots);
  for (Py_ssize_t i = 0; i < self->n_slots; i++) {
    if (handle_of(slot_obj[i], &self->slot_mem[i]) < 0) return -1;
  }
  memset(self->pending, 0, (size_t)self->n_args * sizeof(PyObject *));
  return 0;
}

/* Enqueues steps [*at, stop) (without the GIL); the error code, *at the step reached, *routine the
 * call that failed. */
static cl_int enqueue_steps(Recording *self, cl_handle queue, PyObject **slot_obj, Py_ssize_t *at_io, Py_ssize_t stop,
                            const char **routine, unsigned long long *launches, unsigned long long *copies,
                            unsigned long long *sets) {
  cl_int err = CL_SUCCESS;
  Py_ssize_t at = *at_io;
  for (; at < stop; at++) {
    Step *s = &self->steps[at];
    if (s->kind == STEP_COPY) {
      if (s->nbytes) {
        err = enqueue_copy_buffer(queue, self->slot_mem[s->src], self->slot_mem[s->dst], 0, 0, s->nbytes, 0, NULL,
                                  NULL);
        if (err != CL_SUCCESS) {
          *routine = "clEnqueueCopyBuffer";
          break;
        }
        (*copies)++;
      }
      continue;
    }
    for (Py_ssize_t j = s->first_arg; j < s->first_arg + s->n_args; j++) {
      PyObject *obj = slot_obj[self->arg_slot[j]];
      if (obj == self->bound[j]) continue;
      err = set_kernel_arg(s->kernel, self->arg_index[j], sizeof(cl_handle), &self->slot_mem[self->arg_slot[j]]);
      if (err != CL_SUCCESS) {
        *routine = "clSetKernelArg";
        break;
      }
      self->pending[j] = obj;
      (*sets)++;
    }
    if (err != CL_SUCCESS) break;
    err = enqueue_nd_range_kernel(queue, s->kernel, s->work_dim, NULL, s->global, s->has_local ? s->local : NULL, 0,
                                  NULL, NULL);
    if (err != CL_SUCCESS) {
      *routine = "clEnqueueNDRangeKernel";
      break;
    }
    (*launches)++;
  }
  *at_io = at;
  return err;
}

/* After a replay (with the GIL): the arguments set become the ones recorded as bound. */
static void commit_bound(Recording *self) {
  for (Py_ssize_t j = 0; j < self->n_args; j++) {
    PyObject *obj = self->pending[j];
    if (obj) {
      PyObject *old = self->bound[j];
      Py_INCREF(obj);
      self->bound[j] = obj;
      Py_XDECREF(old);
    }
  }
}

/* replay(queue, slots, start=0, stop=len) -> (0, stop, "") on success, (error code, step, routine)
 * where a call failed: the arguments set before it stay recorded as bound, the failed one does not. */
static PyObject *Recording_replay(Recording *self, PyObject *args, PyObject *kwds) {
  PyObject *queue_obj, *slots_in;
  Py_ssize_t start = 0, stop = -1;
  static char *kwlist[] = {"queue", "slots", "start", "stop", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|nn", kwlist, &queue_obj, &slots_in, &start, &stop)) return NULL;
  if (!set_kernel_arg) {
    PyErr_SetString(PyExc_RuntimeError, "_replay.load() has not found the OpenCL entry points");
    return NULL;
  }
  if (stop < 0 || stop > self->n_steps) stop = self->n_steps;
  if (start < 0) start = 0;
  cl_handle queue;
  if (handle_of(queue_obj, &queue) < 0) return NULL;
  PyObject *slots = PySequence_Fast(slots_in, "slots must be a sequence");
  if (!slots) return NULL;
  if (load_slots(self, slots) < 0) {
    Py_DECREF(slots);
    return NULL;
  }
  PyObject **slot_obj = PySequence_Fast_ITEMS(slots);
  cl_int err;
  const char *routine = "";
  Py_ssize_t at = start;
  unsigned long long launches = 0, copies = 0, sets = 0;
  Py_BEGIN_ALLOW_THREADS
  err = enqueue_steps(self, queue, slot_obj, &at, stop, &routine, &launches, &copies, &sets);
  Py_END_ALLOW_THREADS
  n_launches += launches;
  n_copies += copies;
  n_set_args += sets;
  commit_bound(self);
  Py_DECREF(slots);
  return Py_BuildValue("(ins)", (int)err, at, routine);
}

/* One host transfer of run_host: a slot and a contiguous host buffer of the slot's byte count. */
typedef struct {
  Py_ssize_t slot;
  Py_buffer view;
} HostCopy;

static Py_ssize_t take_copies(PyObject *seq, Recording *self, HostCopy **out, int writable, const char *what) {
  PyObject *fast = PySequence_Fast(seq, what);
  if (!fast) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  HostCopy *c = PyMem_Calloc(n ? n : 1, sizeof(HostCopy));
  if (!c) {
    Py_DECREF(fast);
    PyErr_NoMemory();
    return -1;
  }
  Py_ssize_t i = 0;
  for (; i < n; i++) {
    PyObject *pair = PySequence_Fast_GET_ITEM(fast, i);
    if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
      PyErr_Format(PyExc_TypeError, "%s: item %zd must be (slot, array)", what, i);
      break;
    }
    if ((c[i].slot = slot_index(PyTuple_GET_ITEM(pair, 0), self->n_slots)) < 0) break;
    /* C-contiguous only: a strided array is the caller's to copy (its Python path does) */
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(pair, 1), &c[i].view,
                           writable ? (PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) : PyBUF_C_CONTIGUOUS) < 0)
      break;
  }
  Py_DECREF(fast);
  if (i < n) {
    for (Py_ssize_t j = 0; j < i; j++) PyBuffer_Release(&c[j].view);
    PyMem_Free(c);
    return -1;
  }
  *out = c;
  return n;
}

static void release_copies(HostCopy *c, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; i++) PyBuffer_Release(&c[i].view);
  PyMem_Free(c);
}

/* run_host(queue, slots, writes, reads) -> (0, steps, "") or (error code, step, routine): a whole run
 * in one call: each (slot, host array) of writes copied to its slot's buffer (not blocking), every
 * step replayed, each (slot, host array) of reads copied back, and the queue finished, so every host
 * array is free again on return, failed or not (the host arrays are held by buffer views until
 * then). step is -1 for a failed write, n_steps for a failed read or finish. */
static PyObject *Recording_run_host(Recording *self, PyObject *args) {
  PyObject *queue_obj, *slots_in, *writes_in, *reads_in;
  if (!PyArg_ParseTuple(args, "OOOO", &queue_obj, &slots_in, &writes_in, &reads_in)) return NULL;
  if (!enqueue_write_buffer) {
    PyErr_SetString(PyExc_RuntimeError, "_replay.load() has not found the OpenCL entry points");
    return NULL;
  }
  cl_handle queue;
  if (handle_of(queue_obj, &queue) < 0) return NULL;
  PyObject *slots = PySequence_Fast(slots_in, "slots must be a sequence");
  if (!slots) return NULL;
  HostCopy *writes = NULL, *reads = NULL;
  Py_ssize_t n_w = -1, n_r = -1;
  if (load_slots(self, slots) < 0 || (n_w = take_copies(writes_in, self, &writes, 0, "writes")) < 0 ||
      (n_r = take_copies(reads_in, self, &reads, 1, "reads")) < 0) {
    if (n_w >= 0) release_copies(writes, n_w);
    Py_DECREF(slots);
    return NULL;
  }
  PyObject **slot_obj = PySequence_Fast_ITEMS(slots);
  cl_int err = CL_SUCCESS;
  const char *routine = "";
  Py_ssize_t at = -1;
  unsigned long long launches = 0, copies = 0, sets = 0, w = 0, r = 0;
  Py_BEGIN_ALLOW_THREADS
  for (Py_ssize_t i = 0; i < n_w && err == CL_SUCCESS; i++) {
    if (!writes[i].view.len) continue;
    err = enqueue_write_buffer(queue, self->slot_mem[writes[i].slot], 0, 0, (size_t)writes[i].view.len,
                               writes[i].view.buf, 0, NULL, NULL);
    if (err != CL_SUCCESS) routine = "clEnqueueWriteBuffer";
    else w++;
  }
  if (err == CL_SUCCESS) {
    at = 0;
    err = enqueue_steps(self, queue, slot_obj, &at, self->n_steps, &routine, &launches, &copies, &sets);
  }
  for (Py_ssize_t i = 0; i < n_r && err == CL_SUCCESS; i++) {
    if (!reads[i].view.len) continue;
    err = enqueue_read_buffer(queue, self->slot_mem[reads[i].slot], 0, 0, (size_t)reads[i].view.len,
                              reads[i].view.buf, 0, NULL, NULL);
    if (err != CL_SUCCESS) routine = "clEnqueueReadBuffer";
    else r++;
  }
  /* one wait for the whole run; after a failure too, as the host arrays are released below */
  cl_int fin = finish(queue);
  if (err == CL_SUCCESS && fin != CL_SUCCESS) {
    err = fin;
    routine = "clFinish";
  }
  Py_END_ALLOW_THREADS
  n_launches += launches;
  n_copies += copies;
  n_set_args += sets;
  n_writes += w;
  n_reads += r;
  n_finishes++;
  commit_bound(self);
  release_copies(writes, n_w);
  release_copies(reads, n_r);
  Py_DECREF(slots);
  return Py_BuildValue("(ins)", (int)err, at, routine);
}

static PyObject *Recording_forget(Recording *self, PyObject *Py_UNUSED(ignored)) {
  for (Py_ssize_t j = 0; j < self->n_args; j++) Py_CLEAR(self->bound[j]);
  Py_RETURN_NONE;
}

static PyObject *Recording_len(Recording *self, void *Py_UNUSED(closure)) { return PyLong_FromSsize_t(self->n_steps); }

static PyMethodDef Recording_methods[] = {
    {"replay", (PyCFunction)(void (*)(void))Recording_replay, METH_VARARGS | METH_KEYWORDS,
     "replay(queue, slots, start=0, stop=-1) -> (cl error code, step reached, failed routine): enqueue steps [start, stop)"},
    {"run_host", (PyCFunction)Recording_run_host, METH_VARARGS,
     "run_host(queue, slots, writes, reads) -> (cl error code, step reached, failed routine): host writes, every "
     "step, host reads and a finish in one call"},
    {"forget", (PyCFunction)Recording_forget, METH_NOARGS,
     "drop the buffers the arguments are recorded as holding (the next replay sets every one)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Recording_getset[] = {
    {"steps", (getter)Recording_len, NULL, "number of recorded steps", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RecordingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "onnxhal.runtime.providers.opencl._replay.Recording",
    .tp_basicsize = sizeof(Recording),
    .tp_dealloc = (destructor)Recording_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A partition's recorded launches and copies, replayed by one call",
    .tp_methods = Recording_methods,
    .tp_getset = Recording_getset,
    .tp_new = Recording_new,
};

/* load(path): open the OpenCL library at path (one already loaded by pyopencl) and take the entry
 * points; raises OSError if it cannot. */
static PyObject *load(PyObject *Py_UNUSED(module), PyObject *args) {
  const char *path;
  if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
#ifdef _WIN32
  HMODULE lib = LoadLibraryA(path);
  if (!lib) return PyErr_Format(PyExc_OSError, "cannot load %s (error %lu)", path, GetLastError());
#define SYM(name) (void *)GetProcAddress(lib, name)
#else
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) return PyErr_Format(PyExc_OSError, "cannot load %s: %s", path, dlerror());
#define SYM(name) dlsym(lib, name)
#endif
  void *s = SYM("clSetKernelArg"), *e = SYM("clEnqueueNDRangeKernel"), *c = SYM("clEnqueueCopyBuffer");
  void *w = SYM("clEnqueueWriteBuffer"), *r = SYM("clEnqueueReadBuffer"), *f = SYM("clFinish");
#undef SYM
  if (!s || !e || !c || !w || !r || !f)
    return PyErr_Format(PyExc_OSError, "%s lacks clSetKernelArg, clEnqueueNDRangeKernel, clEnqueueCopyBuffer, "
                        "clEnqueueWriteBuffer, clEnqueueReadBuffer or clFinish", path);
  /* The library stays open for the process: recordings call into it until exit. */
  set_kernel_arg = (SetKernelArgFn)s;
  enqueue_nd_range_kernel = (EnqueueNDRangeKernelFn)e;
  enqueue_copy_buffer = (EnqueueCopyBufferFn)c;
  enqueue_write_buffer = (EnqueueWriteBufferFn)w;
  enqueue_read_buffer = (EnqueueReadBufferFn)r;
  finish = (FinishFn)f;
  Py_RETURN_NONE;
}

static PyObject *counters(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
  return Py_BuildValue("(KKKKKK)", n_launches, n_copies, n_set_args, n_writes, n_reads, n_finishes);
}

/* set_scalar_arg(kernel, index, value): clSetKernelArg(kernel, index, the value's bytes) for a kernel
 * handle (pyopencl's int_ptr) and a by-value argument (a numpy scalar: any object with the buffer
 * protocol); returns the OpenCL status (0: CL_SUCCESS). pyopencl's set_arg takes ~6 us for a scalar
 * (it tries the memory-object conversions first), a partition state sets tens of them once. */
static PyObject *set_scalar_arg(PyObject *Py_UNUSED(module), PyObject *args) {
  unsigned long long kernel;
  unsigned int index;
  Py_buffer value;
  if (!set_kernel_arg) return PyErr_Format(PyExc_RuntimeError, "_replay.load was not called");
  if (!PyArg_ParseTuple(args, "KIy*", &kernel, &index, &value)) return NULL;
  cl_int err = set_kernel_arg((cl_handle)(uintptr_t)kernel, (cl_uint)index, (size_t)value.len, value.buf);
  PyBuffer_Release(&value);
  return PyLong_FromLong((long)err);
}

static PyMethodDef module_methods[] = {
    {"load", load, METH_VARARGS, "load(path): take the OpenCL entry points from the library at path"},
    {"set_scalar_arg", set_scalar_arg, METH_VARARGS,
     "set_scalar_arg(kernel_int_ptr, index, value): clSetKernelArg with the value's bytes; the OpenCL status"},
    {"counters", counters, METH_NOARGS, "(launches, copies, set_arg calls, host writes, host reads, finishes) made by replays in this process"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_replay", "The OpenCL EP's native replay of recorded launches.", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__replay(void) {
  if (PyType_Ready(&RecordingType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  Py_INCREF(&RecordingType);
  if (PyModule_AddObject(m, "Recording", (PyObject *)&RecordingType) < 0) {
    Py_DECREF(&RecordingType);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
