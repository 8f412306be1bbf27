/* The CPU EP's optional C kernels (onnxhal.runtime.providers.cpu.kernels._native): a tree ensemble
 * walked tree by tree over the rows, libsvm's pairwise coupling row by row, an LSTM's steps
 * (recurrent.py's default form), direct and small 1x1 convolutions (fused_conv.py), per-tensor
 * quantization (quantize.py), small layer norms (normalization.py), softmax rows and Gelu
 * (numerics.py), RMS norm rows (rms_group_norm.py), attention of few scores and rotary embeddings
 * (onnx_attention.py), for the small runs where
 * numpy's per-call cost (or BLAS's per-channel products) is the whole run. Python's C API and the buffer protocol only (no numpy headers): it builds with a C compiler
 * alone, and an install without one leaves ml_trees.py on its numpy kernel, the canonical one.
 *
 * Semantics are ml_trees.py's numpy kernel's, to the bit:
 * - a node's test is `x[feature] CMP threshold`, true branch where it holds, or where the value is
 *   NaN and the node's missing value tracks true, as onnxruntime's TREE_FIND_VALUE
 *   (onnxruntime/core/providers/cpu/ml/tree_ensemble_common.h). Inputs and thresholds (float32 or
 *   float64) are both widened to double, which is exact, so every comparison is the one numpy makes
 *   in the promoted type;
 * - SUM / AVERAGE: per output, the first tree's leaf weight, then each next tree's added in tree
 *   order in the weights' type (numpy's add.reduce over the tree axis, onnxruntime's
 *   TreeAggregatorSum::ProcessTreeNodePrediction in tree_ensemble_aggregator.h); AVERAGE divides
 *   the sum by the tree count in that type; no tree: 0;
 * - MIN / MAX: per output, over the trees whose leaf writes it, numpy's minimum / maximum in tree
 *   order (`a < b || a is NaN ? a : b`: NaN propagates, a tie keeps the later); an output no tree
 *   wrote is 0.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { LEAF = 6 };
enum { HOW_SUM = 0, HOW_AVERAGE = 1, HOW_MIN = 2, HOW_MAX = 3 };

typedef struct {
  double threshold;
  int64_t feature;
  int32_t next[2]; /* false, true */
  int8_t mode;
  uint8_t missing;
} TreeNode;

typedef struct {
  PyObject_HEAD
  Py_ssize_t nodes, trees, outputs;
  int64_t max_feature; /* the largest feature an interior node reads; -1 where none */
  int weights_double;
  int uniform_mode; /* the one mode (0-5) of every interior node, else 6 */
  TreeNode *node;
  Py_ssize_t *root;
  Py_ssize_t *tree_depth; /* per tree its longest root-to-leaf walk */
  void *weights; /* [nodes, outputs] float or double */
  uint8_t *has;  /* [nodes, outputs] */
} Forest;

/* A C-contiguous buffer of `count` items of `itemsize` bytes whose format is one of `formats`
 * (NULL: any). */
static int get_buffer(PyObject *obj, Py_buffer *view, const char *what, Py_ssize_t itemsize, const char *formats,
                      Py_ssize_t count, int writable) {
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
  const char *fmt = view->format ? view->format : "B";
  if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@') fmt++;
  if (view->itemsize != itemsize || (formats && (strlen(fmt) != 1 || !strchr(formats, fmt[0]))) ||
      (count >= 0 && view->len != count * itemsize)) {
    PyErr_Format(PyExc_ValueError, "%s: expected %zd items of %zd bytes (format one of '%s'), got %zd bytes of "
                 "format '%s'", what, count, itemsize, formats ? formats : "any", view->len, fmt);
    PyBuffer_Release(view);
    return -1;
  }
  return 0;
}

static void release_buffers(int count, Py_buffer *views) {
  for (int i = 0; i < count; i++) PyBuffer_Release(&views[i]);
}

/* get_buffer over `count` objects of one item type (the first `writable` of them writable); on an
 * error those already taken are released */
static int get_buffers(int count, Py_buffer *views, PyObject *const *objs, const char *const *what, Py_ssize_t itemsize,
                       const char *formats, const Py_ssize_t *counts, int writable) {
  for (int i = 0; i < count; i++)
    if (get_buffer(objs[i], &views[i], what[i], itemsize, formats, counts[i], i < writable) < 0) {
      release_buffers(i, views);
      return -1;
    }
  return 0;
}

/* The main input of a float kernel: a C-contiguous float32 or float64 buffer of `ndim` axes.
 * Returns its item size (4 or 8), or 0 with `message` as the ValueError and the buffer released. */
static Py_ssize_t get_float_input(PyObject *obj, Py_buffer *view, int ndim, const char *message) {
  if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return 0;
  const char *fmt = view->format ? view->format : "B";
  if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@') fmt++;
  if (view->ndim != ndim || strlen(fmt) != 1 || !strchr("fd", fmt[0]) || view->itemsize != (fmt[0] == 'f' ? 4 : 8)) {
    PyErr_SetString(PyExc_ValueError, message);
    PyBuffer_Release(view);
    return 0;
  }
  return view->itemsize;
}

/* get_float_input's x, then y: writable, of x's item type, any shape. Returns the item size, or 0
 * with the error set and neither held. */
static Py_ssize_t get_float_input_output(PyObject *o_x, PyObject *o_y, Py_buffer *bx, Py_buffer *by, int ndim,
                                         const char *message) {
  Py_ssize_t size = get_float_input(o_x, bx, ndim, message);
  if (!size) return 0;
  if (get_buffer(o_y, by, "y", size, size == 4 ? "f" : "d", -1, 1) < 0) {
    PyBuffer_Release(bx);
    return 0;
  }
  return size;
}

static void forest_dealloc(Forest *self) {
  PyMem_Free(self->node);
  PyMem_Free(self->root);
  PyMem_Free(self->tree_depth);
  PyMem_Free(self->weights);
  PyMem_Free(self->has);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Forest(feature int64[n], threshold float64[n], mode int8[n], true_next int64[n],
 *        false_next int64[n], missing bool[n], roots int64[t], weights float32|float64[n, k],
 *        has bool[n, k], outputs k, tree_depth int64[t]: per tree its longest root-to-leaf walk) */
static PyObject *forest_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
  PyObject *o_feature, *o_threshold, *o_mode, *o_true, *o_false, *o_missing, *o_roots, *o_weights, *o_has, *o_depth;
  Py_ssize_t outputs;
  static char *names[] = {"feature", "threshold", "mode", "true_next", "false_next", "missing", "roots",
                          "weights", "has", "outputs", "tree_depth", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOOOnO", names, &o_feature, &o_threshold, &o_mode, &o_true,
                                   &o_false, &o_missing, &o_roots, &o_weights, &o_has, &outputs, &o_depth))
    return NULL;
  if (outputs < 1) {
    PyErr_SetString(PyExc_ValueError, "Forest: outputs must be >= 1");
    return NULL;
  }
  Py_buffer b_feature, b_threshold, b_mode, b_true, b_false, b_missing, b_roots, b_weights, b_has, b_depth;
  Py_buffer *held[10];
  int n_held = 0;
  Forest *self = NULL;
  if (get_buffer(o_feature, &b_feature, "feature", 8, "lq", -1, 0) < 0) goto fail;
  held[n_held++] = &b_feature;
  Py_ssize_t n = b_feature.len / 8;
  if (n >= INT32_MAX) {
    PyErr_SetString(PyExc_ValueError, "Forest: too many nodes");
    goto fail;
  }
  if (get_buffer(o_threshold, &b_threshold, "threshold", 8, "d", n, 0) < 0) goto fail;
  held[n_held++] = &b_threshold;
  if (get_buffer(o_mode, &b_mode, "mode", 1, "bB", n, 0) < 0) goto fail;
  held[n_held++] = &b_mode;
  if (get_buffer(o_true, &b_true, "true_next", 8, "lq", n, 0) < 0) goto fail;
  held[n_held++] = &b_true;
  if (get_buffer(o_false, &b_false, "false_next", 8, "lq", n, 0) < 0) goto fail;
  held[n_held++] = &b_false;
  if (get_buffer(o_missing, &b_missing, "missing", 1, "?bB", n, 0) < 0) goto fail;
  held[n_held++] = &b_missing;
  if (get_buffer(o_roots, &b_roots, "roots", 8, "lq", -1, 0) < 0) goto fail;
  held[n_held++] = &b_roots;
  if (PyObject_GetBuffer(o_weights, &b_weights, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto fail;
  held[n_held++] = &b_weights;
  if (!((b_weights.itemsize == 4 && b_weights.format && strchr("f", b_weights.format[strlen(b_weights.format) - 1])) ||
        (b_weights.itemsize == 8 && b_weights.format && strchr("d", b_weights.format[strlen(b_weights.format) - 1]))) ||
      b_weights.len != n * outputs * b_weights.itemsize) {
    PyErr_SetString(PyExc_ValueError, "Forest: weights must be float32 or float64 [nodes, outputs]");
    goto fail;
  }
  if (get_buffer(o_has, &b_has, "has", 1, "?bB", n * outputs, 0) < 0) goto fail;
  held[n_held++] = &b_has;
  if (get_buffer(o_depth, &b_depth, "tree_depth", 8, "lq", b_roots.len / 8, 0) < 0) goto fail;
  held[n_held++] = &b_depth;

  self = (Forest *)type->tp_alloc(type, 0);
  if (!self) goto fail;
  self->nodes = n;
  self->trees = b_roots.len / 8;
  self->outputs = outputs;
  self->weights_double = b_weights.itemsize == 8;
  self->max_feature = -1;
  self->uniform_mode = -1;
  self->node = PyMem_Calloc(n ? n : 1, sizeof(TreeNode));
  self->root = PyMem_Calloc(self->trees ? self->trees : 1, sizeof(Py_ssize_t));
  self->tree_depth = PyMem_Calloc(self->trees ? self->trees : 1, sizeof(Py_ssize_t));
  self->weights = PyMem_Malloc(b_weights.len ? b_weights.len : 1);
  self->has = PyMem_Malloc(b_has.len ? b_has.len : 1);
  if (!self->node || !self->root || !self->tree_depth || !self->weights || !self->has) {
    PyErr_NoMemory();
    goto fail;
  }
  const int64_t *feature = b_feature.buf, *true_next = b_true.buf, *false_next = b_false.buf, *roots = b_roots.buf;
  const double *threshold = b_threshold.buf;
  const int8_t *mode = b_mode.buf;
  const uint8_t *missing = b_missing.buf;
  for (Py_ssize_t i = 0; i < n; i++) {
    TreeNode *nd = &self->node[i];
    if (mode[i] < 0 || mode[i] > LEAF) {
      PyErr_Format(PyExc_ValueError, "Forest: node %zd has mode %d (0-6 only)", i, (int)mode[i]);
      goto fail;
    }
    if (true_next[i] < 0 || true_next[i] >= n || false_next[i] < 0 || false_next[i] >= n) {
      PyErr_Format(PyExc_ValueError, "Forest: node %zd has a child outside the %zd nodes", i, n);
      goto fail;
    }
    if (mode[i] != LEAF && feature[i] < 0) {
      PyErr_Format(PyExc_ValueError, "Forest: node %zd reads feature %lld", i, (long long)feature[i]);
      goto fail;
    }
    nd->mode = mode[i];
    nd->threshold = threshold[i];
    nd->feature = mode[i] == LEAF ? 0 : feature[i];
    nd->next[0] = (int32_t)false_next[i];
    nd->next[1] = (int32_t)true_next[i];
    nd->missing = missing[i] != 0;
    if (mode[i] != LEAF && feature[i] > self->max_feature) self->max_feature = feature[i];
    if (mode[i] != LEAF) self->uniform_mode = self->uniform_mode == -1 || self->uniform_mode == mode[i] ? mode[i] : LEAF;
  }
  if (self->uniform_mode < 0) self->uniform_mode = LEAF; /* no interior node: no step is taken */
  for (Py_ssize_t t = 0; t < self->trees; t++) {
    if (roots[t] < 0 || roots[t] >= n) {
      PyErr_Format(PyExc_ValueError, "Forest: root %zd is outside the %zd nodes", t, n);
      goto fail;
    }
    self->root[t] = (Py_ssize_t)roots[t];
    /* at most one step per node: a walk longer than that would be a cycle, which no step count
       makes safe to take as given */
    int64_t d = ((const int64_t *)b_depth.buf)[t];
    if (d < 0 || d > n) {
      PyErr_Format(PyExc_ValueError, "Forest: tree %zd has depth %lld (0 to %zd)", t, (long long)d, n);
      goto fail;
    }
    self->tree_depth[t] = (Py_ssize_t)d;
  }
  memcpy(self->weights, b_weights.buf, b_weights.len);
  memcpy(self->has, b_has.buf, b_has.len);
  for (int i = 0; i < n_held; i++) PyBuffer_Release(held[i]);
  return (PyObject *)self;
fail:
  for (int i = 0; i < n_held; i++) PyBuffer_Release(held[i]);
  Py_XDECREF(self);
  return NULL;
}

/* The leaves `count` rows (at most BLOCK, `row_bytes` apart) reach from `root` in `steps` steps
 * (the tree's longest root-to-leaf walk): a leaf's children are itself, so a row that reached its
 * leaf stays there and the rows walk in lockstep, without a branch on where each one is (their
 * independent loads overlap). A node's test as onnxruntime's TREE_FIND_VALUE. */
enum { BLOCK = 8 };

typedef void (*WalkFn)(const Forest *f, Py_ssize_t root, Py_ssize_t steps, const char *rows, Py_ssize_t row_bytes,
                       Py_ssize_t count, Py_ssize_t *leaf);

static inline int compare_mode(double v, double th, int8_t mode) {
  switch (mode) {
    case 0: return v <= th;
    case 1: return v < th;
    case 2: return v >= th;
    case 3: return v > th;
    case 4: return v == th;
    case 5: return v != th;
    default: return 0; /* a leaf: both children are itself */
  }
}

#define CMP_LEQ(v, th, nd) ((v) <= (th))
#define CMP_LT(v, th, nd) ((v) < (th))
#define CMP_GTE(v, th, nd) ((v) >= (th))
#define CMP_GT(v, th, nd) ((v) > (th))
#define CMP_EQ(v, th, nd) ((v) == (th))
#define CMP_NEQ(v, th, nd) ((v) != (th))
#define CMP_ANY(v, th, nd) compare_mode((v), (th), (nd)->mode)

/* One walker per input type and comparison: where every interior node has one mode, the leaves
 * may take that comparison too (their two children are the same). */
#define WALKER(NAME, XT, CMP)                                                                        \
  static void NAME(const Forest *f, Py_ssize_t root, Py_ssize_t steps, const char *rows,            \
                   Py_ssize_t row_bytes, Py_ssize_t count, Py_ssize_t *leaf) {                       \
    for (Py_ssize_t b = 0; b < count; b++) leaf[b] = root;                                           \
    for (Py_ssize_t step = 0; step < steps; step++) {                                                \
      for (Py_ssize_t b = 0; b < count; b++) {                                                       \
        const TreeNode *nd = &f->node[leaf[b]];                                                      \
        double v = (double)((const XT *)(rows + b * row_bytes))[nd->feature];                        \
        int go = CMP(v, nd->threshold, nd);                                                          \
        go |= nd->missing & (v != v); /* NaN, where the missing value tracks true */                 \
        leaf[b] = nd->next[go];                                                                      \
      }                                                                                              \
    }                                                                                                \
  }

WALKER(walk_f_leq, float, CMP_LEQ)
WALKER(walk_f_lt, float, CMP_LT)
WALKER(walk_f_gte, float, CMP_GTE)
WALKER(walk_f_gt, float, CMP_GT)
WALKER(walk_f_eq, float, CMP_EQ)
WALKER(walk_f_neq, float, CMP_NEQ)
WALKER(walk_f_any, float, CMP_ANY)
WALKER(walk_d_leq, double, CMP_LEQ)
WALKER(walk_d_lt, double, CMP_LT)
WALKER(walk_d_gte, double, CMP_GTE)
WALKER(walk_d_gt, double, CMP_GT)
WALKER(walk_d_eq, double, CMP_EQ)
WALKER(walk_d_neq, double, CMP_NEQ)
WALKER(walk_d_any, double, CMP_ANY)

/* [x is double][the forest's one mode 0-5, or 6: mixed] */
static const WalkFn WALKERS[2][7] = {
    {walk_f_leq, walk_f_lt, walk_f_gte, walk_f_gt, walk_f_eq, walk_f_neq, walk_f_any},
    {walk_d_leq, walk_d_lt, walk_d_gte, walk_d_gt, walk_d_eq, walk_d_neq, walk_d_any},
};

/* Trees outside, rows inside (a tree's nodes stay in cache over the rows); per row and output the
 * trees still come in tree order, so the sums are those of one row's loop over the trees. */
#define AGGREGATE(T)                                                                                 \
  {                                                                                                  \
    const T *weights = f->weights;                                                                   \
    T *scores = (T *)out;                                                                            \
    T fill = how <= HOW_AVERAGE ? (T)0 : (how == HOW_MIN ? (T)INFINITY : (T)-INFINITY);              \
    for (Py_ssize_t i = 0; i < rows * k; i++) scores[i] = fill;                                      \
    if (written) memset(written, 0, (size_t)(rows * k));                                             \
    Py_ssize_t leaf[BLOCK];                                                                          \
    WalkFn walker = WALKERS[x_double][f->uniform_mode];                                              \
    for (Py_ssize_t t = 0; t < f->trees; t++) {                                                      \
      for (Py_ssize_t r0 = 0; r0 < rows; r0 += BLOCK) {                                              \
        Py_ssize_t count = rows - r0 < BLOCK ? rows - r0 : BLOCK;                                    \
        walker(f, f->root[t], f->tree_depth[t], x + r0 * row_bytes, row_bytes, count, leaf);        \
        for (Py_ssize_t b = 0; b < count; b++) {                                                     \
          const T *w = weights + leaf[b] * k;                                                        \
          const uint8_t *h = f->has + leaf[b] * k;                                                   \
          T *s = scores + (r0 + b) * k;                                                              \
          if (written) {                                                                             \
            uint8_t *w_out = written + (r0 + b) * k;                                                 \
            for (Py_ssize_t j = 0; j < k; j++) w_out[j] |= h[j];                                     \
          }                                                                                          \
          if (how <= HOW_AVERAGE) {                                                                  \
            if (t == 0)                                                                              \
              for (Py_ssize_t j = 0; j < k; j++) s[j] = w[j];                                        \
            else                                                                                     \
              for (Py_ssize_t j = 0; j < k; j++) s[j] = (T)(s[j] + w[j]);                            \
          } else if (how == HOW_MIN) {                                                               \
            for (Py_ssize_t j = 0; j < k; j++) {                                                     \
              T v = h[j] ? w[j] : (T)INFINITY;                                                       \
              s[j] = (s[j] < v || isnan(s[j])) ? s[j] : v;                                           \
            }                                                                                        \
          } else {                                                                                   \
            for (Py_ssize_t j = 0; j < k; j++) {                                                     \
              T v = h[j] ? w[j] : (T)-INFINITY;                                                      \
              s[j] = (s[j] > v || isnan(s[j])) ? s[j] : v;                                           \
            }                                                                                        \
          }                                                                                          \
        }                                                                                            \
      }                                                                                              \
    }                                                                                                \
    if (how == HOW_AVERAGE) {                                                                        \
      T n_trees = (T)f->trees;                                                                       \
      for (Py_ssize_t i = 0; i < rows * k; i++) scores[i] = (T)(scores[i] / n_trees);                \
    } else if (how >= HOW_MIN) {                                                                     \
      for (Py_ssize_t i = 0; i < rows * k; i++)                                                      \
        if (!written[i]) scores[i] = (T)0; /* an output no tree wrote is 0 */                        \
    }                                                                                                \
  }

/* Forest.evaluate(x, how, scores, written): x float32|float64 [rows, width] C-contiguous; how 0-3
 * (SUM, AVERAGE, MIN, MAX); scores [rows, outputs] of the weights' type, written into; written
 * bool [rows, outputs] (which outputs some tree's leaf writes), or None for SUM and AVERAGE. */
static PyObject *forest_evaluate(Forest *f, PyObject *args) {
  PyObject *o_x, *o_out, *o_written;
  int how;
  if (!PyArg_ParseTuple(args, "OiOO", &o_x, &how, &o_out, &o_written)) return NULL;
  if (how < HOW_SUM || how > HOW_MAX) {
    PyErr_Format(PyExc_ValueError, "evaluate: how must be 0-3 (SUM, AVERAGE, MIN, MAX), got %d", how);
    return NULL;
  }
  Py_buffer bx, bo, bw;
  if (PyObject_GetBuffer(o_x, &bx, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND) < 0) return NULL;
  const char *fmt = bx.format ? bx.format : "B";
  if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@') fmt++;
  int x_double = strcmp(fmt, "d") == 0;
  if (bx.ndim != 2 || !(x_double || strcmp(fmt, "f") == 0)) {
    PyBuffer_Release(&bx);
    PyErr_SetString(PyExc_ValueError, "evaluate: x must be a 2-D float32 or float64 C-contiguous array");
    return NULL;
  }
  Py_ssize_t rows = bx.shape[0], width = bx.shape[1], k = f->outputs;
  if (width <= f->max_feature) {
    PyBuffer_Release(&bx);
    PyErr_Format(PyExc_IndexError, "evaluate: x has %zd columns, the trees read column %lld", width,
                 (long long)f->max_feature);
    return NULL;
  }
  if (get_buffer(o_out, &bo, "scores", f->weights_double ? 8 : 4, f->weights_double ? "d" : "f", rows * k, 1) < 0) {
    PyBuffer_Release(&bx);
    return NULL;
  }
  uint8_t *written = NULL;
  if (o_written == Py_None && how >= HOW_MIN) {
    PyBuffer_Release(&bx);
    PyBuffer_Release(&bo);
    PyErr_SetString(PyExc_ValueError, "evaluate: MIN and MAX need the written array (an output no tree wrote is 0)");
    return NULL;
  }
  if (o_written != Py_None) {
    if (get_buffer(o_written, &bw, "written", 1, "?bB", rows * k, 1) < 0) {
      PyBuffer_Release(&bx);
      PyBuffer_Release(&bo);
      return NULL;
    }
    written = bw.buf;
  }
  const char *x = bx.buf;
  Py_ssize_t row_bytes = width * (x_double ? 8 : 4);
  void *out = bo.buf;
  /* large runs let other threads go on meanwhile (the buffers are held, the forest is immutable) */
  int release = rows * f->trees > 4096;
  PyThreadState *ts = release ? PyEval_SaveThread() : NULL;
  if (f->weights_double)
    AGGREGATE(double)
  else
    AGGREGATE(float)
  if (release) PyEval_RestoreThread(ts);
  PyBuffer_Release(&bx);
  PyBuffer_Release(&bo);
  if (written) PyBuffer_Release(&bw);
  Py_RETURN_NONE;
}

/* coupling(v, pair_i, pair_j, k, out): libsvm's multiclass_probability (svm.cpp; onnxruntime's
 * ml_common.h has it in float) row by row in double: v float32 [rows, pairs] the clipped pairwise
 * probabilities r[i, j] of the pairs (i, j) (r[j, i] = 1 - r[i, j]); out float32 [rows, k]. Q and
 * the loop as libsvm writes them (Qp and pQp updated within an iteration; a NaN error is passed
 * over by the max, so a row of NaN keeps p = 1/k). */
static PyObject *coupling(PyObject *module, PyObject *args) {
  PyObject *o_v, *o_i, *o_j, *o_out;
  Py_ssize_t k;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOOnO", &o_v, &o_i, &o_j, &k, &o_out)) return NULL;
  if (k < 2 || k > 4096) {
    PyErr_Format(PyExc_ValueError, "coupling: k must be 2 to 4096, got %zd", k);
    return NULL;
  }
  Py_ssize_t pairs = k * (k - 1) / 2;
  Py_buffer bv, bi, bj, bo;
  int held = 0;
  PyObject *result = NULL;
  double *work = NULL;
  if (get_buffer(o_i, &bi, "pair_i", 8, "lq", pairs, 0) < 0) goto done;
  held = 1;
  if (get_buffer(o_j, &bj, "pair_j", 8, "lq", pairs, 0) < 0) goto done;
  held = 2;
  if (get_buffer(o_v, &bv, "v", 4, "f", -1, 0) < 0) goto done;
  held = 3;
  if (bv.len % (pairs * 4)) {
    PyErr_SetString(PyExc_ValueError, "coupling: v must be [rows, k (k - 1) / 2] float32");
    goto done;
  }
  Py_ssize_t rows = bv.len / (pairs * 4);
  if (get_buffer(o_out, &bo, "out", 4, "f", rows * k, 1) < 0) goto done;
  held = 4;
  const int64_t *pi = bi.buf, *pj = bj.buf;
  for (Py_ssize_t c = 0; c < pairs; c++)
    if (pi[c] < 0 || pi[c] >= k || pj[c] < 0 || pj[c] >= k || pi[c] == pj[c]) {
      PyErr_Format(PyExc_ValueError, "coupling: pair %zd is (%lld, %lld), outside %zd classes", c, (long long)pi[c],
                   (long long)pj[c], k);
      goto done;
    }
  work = PyMem_Malloc(sizeof(double) * (size_t)(2 * k * k + 2 * k));
  if (!work) {
    PyErr_NoMemory();
    goto done;
  }
  double *r = work, *Q = work + k * k, *Qp = Q + k * k, *p = Qp + k;
  const float *v = bv.buf;
  float *out = bo.buf;
  double eps = 0.005 / (double)k;
  PyThreadState *ts = rows * k * k > 65536 ? PyEval_SaveThread() : NULL;
  for (Py_ssize_t n = 0; n < rows; n++) {
    memset(r, 0, sizeof(double) * (size_t)(k * k));
    for (Py_ssize_t c = 0; c < pairs; c++) {
      double a = (double)v[n * pairs + c];
      r[pi[c] * k + pj[c]] = a;
      r[pj[c] * k + pi[c]] = 1 - a;
    }
    for (Py_ssize_t t = 0; t < k; t++) {
      p[t] = 1.0 / (double)k;
      Q[t * k + t] = 0;
      for (Py_ssize_t j = 0; j < t; j++) {
        Q[t * k + t] += r[j * k + t] * r[j * k + t];
        Q[t * k + j] = Q[j * k + t];
      }
      for (Py_ssize_t j = t + 1; j < k; j++) {
        Q[t * k + t] += r[j * k + t] * r[j * k + t];
        Q[t * k + j] = -r[j * k + t] * r[t * k + j];
      }
    }
    for (int iter = 0; iter < 100; iter++) {
      double pQp = 0;
      for (Py_ssize_t t = 0; t < k; t++) {
        Qp[t] = 0;
        for (Py_ssize_t j = 0; j < k; j++) Qp[t] += Q[t * k + j] * p[j];
        pQp += p[t] * Qp[t];
      }
      double max_error = 0;
      for (Py_ssize_t t = 0; t < k; t++) {
        double error = fabs(Qp[t] - pQp);
        if (error > max_error) max_error = error;
      }
      if (max_error < eps) break;
      for (Py_ssize_t t = 0; t < k; t++) {
        double diff = (-Qp[t] + pQp) / Q[t * k + t];
        p[t] += diff;
        pQp = (pQp + diff * (diff * Q[t * k + t] + 2 * Qp[t])) / (1 + diff) / (1 + diff);
        for (Py_ssize_t j = 0; j < k; j++) {
          Qp[j] = (Qp[j] + diff * Q[t * k + j]) / (1 + diff);
          p[j] /= (1 + diff);
        }
      }
    }
    for (Py_ssize_t t = 0; t < k; t++) out[n * k + t] = (float)p[t];
  }
  if (ts) PyEval_RestoreThread(ts);
  Py_INCREF(Py_None);
  result = Py_None;
done:
  PyMem_Free(work);
  if (held >= 4) PyBuffer_Release(&bo);
  if (held >= 3) PyBuffer_Release(&bv);
  if (held >= 2) PyBuffer_Release(&bj);
  if (held >= 1) PyBuffer_Release(&bi);
  return result;
}

/* tanh of n floats in place, in a form the compiler vectorizes (no libm call per element):
 * |x| < 0.25: tanh's Taylor series to x^9 (the next term, 62/2835 x^11, is under 2e-8 of tanh
 * there); else (1 - e) / (1 + e) with e = exp(-2 min(|x|, 9)) (tanh(9) rounds to 1 in float),
 * exp by 2^n exp(f), |f| <= ln2 / 2, its Taylor series to f^7 (error under 1e-8); the sign
 * copied back; NaN stays NaN. Within a few float32 ulps of tanh (tests/test_lstm_native.py). */
#if defined(__GNUC__) && !defined(__clang__)
/* the selects below are plain blends only where GCC may assume no FP traps (the values are the same) */
#define NO_TRAPPING_MATH __attribute__((optimize("no-trapping-math")))
#else
#define NO_TRAPPING_MATH
#endif
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__)
/* the LSTM steps, convolutions and epilogues also built for AVX2 and AVX-512, the one the CPU has
 * chosen at load (glibc's ifuncs; the baseline x86-64 build has 4-wide vectors only); no
 * contraction into FMA, so every clone rounds alike; no unroll-and-jam, which fuses two taps'
 * loops into one the vectorizer leaves scalar */
#define VECTOR_CLONES                                                                                       \
  __attribute__((target_clones("avx512f", "avx2", "default"),                                              \
                 optimize("no-trapping-math", "fp-contract=off", "no-loop-unroll-and-jam")))
/* the convolutions': built for x86-64-v4 (AVX-512) and v3 (AVX2 with FMA), where each multiply-add
 * is one FMA instruction, as in onnxruntime's MLAS kernels on those CPUs (the FMA3 and AVX-512F
 * assembly kernels under onnxruntime/core/mlas/lib/x86_64): a convolution's sums are rounded once
 * per tap there and twice in the default build, and the tests hold each to the plain convolution
 * within float rounding. Also no copy loop made a call to memcpy or memset, whose cost is most of
 * a row's copy on small planes */
#define CONV_CLONES                                                                                         \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"),                              \
                 optimize("no-trapping-math", "fp-contract=fast", "no-loop-unroll-and-jam",                 \
                          "no-tree-loop-distribute-patterns")))
/* VECTOR_CLONES that may also assume finite values and ignore zeros' signs: a float max reduction
 * is vectorized only so; for callers that check NaN and infinities themselves */
#define VECTOR_CLONES_FINITE                                                                                \
  __attribute__((target_clones("avx512f", "avx2", "default"),                                              \
                 optimize("no-trapping-math", "finite-math-only", "no-signed-zeros", "fp-contract=off")))
#else
#define VECTOR_CLONES
#define VECTOR_CLONES_FINITE
#define CONV_CLONES
#endif
#if defined(__GNUC__)
#define ALWAYS_INLINE __attribute__((always_inline)) /* into each clone, so it is built for that clone's ISA */
#else
#define ALWAYS_INLINE
#endif
#if defined(_MSC_VER)
#define RESTRICT __restrict
#else
#define RESTRICT restrict
#endif
#define LSTM_TILE 32 /* gates summed in registers at a time: 2 AVX-512 vectors of floats */
static inline ALWAYS_INLINE NO_TRAPPING_MATH void tanh_floats(float *v, Py_ssize_t n) {
  const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer in the low bits */
  int32_t magic_bits;
  memcpy(&magic_bits, &magic, 4);
  for (Py_ssize_t i = 0; i < n; i++) {
    float x = v[i];
    float ax = fabsf(x);
    float a = ax < 9.0f ? ax : 9.0f;
    float z = -2.0f * a;
    float r = z * 1.44269504088896341f + magic;
    int32_t rbits;
    memcpy(&rbits, &r, 4);
    int32_t ni = rbits - magic_bits;
    float nf = r - magic;
    float f = (z - nf * 0.693145751953125f) - nf * 1.42860682030941723212e-6f; /* ln 2 in two parts */
    float p = 1.0f + f * (1.0f + f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120 + f * (1.0f / 720 +
              f * (1.0f / 5040)))))));
    int32_t sbits = (ni + 127) << 23;
    float scale;
    memcpy(&scale, &sbits, 4);
    float e = p * scale;
    float t = (1.0f - e) / (1.0f + e);
    float x2 = ax * ax;
    float s = ax * (1.0f + x2 * (-1.0f / 3 + x2 * (2.0f / 15 + x2 * (-17.0f / 315 + x2 * (62.0f / 2835)))));
    t = ax < 0.25f ? s : t;
    t = copysignf(t, x);
    v[i] = x != x ? x : t;
  }
}

static inline void tanh_doubles(double *v, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; i++) v[i] = tanh(v[i]);
}

/* One direction of an LSTM in its default form (sigmoid, tanh, tanh; no clip, peepholes or
 * input_forget; every sequence the full length), steps first, first + step, ... (count of them):
 * per step and batch row, g = h R^T + xw[t] (R^T [hidden, 4 hidden] read row by row: each gate
 * sum in k order, a loop the compiler vectorizes), the gates in recurrent.py's gate_order (i, f,
 * o, c) with 0.5 folded into i, f and o's weights, so sigmoid = 0.5 + 0.5 tanh as in
 * LSTM._run_default; c = i c~ + f c, h = o tanh(c), written to y[t, d]. h and c hold the initial
 * state on entry and the final one on return.
 * With mult (DynamicQuantizeLSTM, ms_quantized.py's _quantized_direction): rt is R less its zero
 * point and each batch row of h is quantized on its own range before the product, as onnxruntime:
 * lo = min(h, 0), hi = max(h, 0) (tiny +-2^-100 in place of 0: an all-zero row gets a range, its
 * codes 0), scale = (hi - lo) / 255, codes less their zero point min(rint(h / scale),
 * rint(lo / scale) + 255); their product with rt is exact (integers, float32 while hidden x 255^2
 * < 2^24), then scaled per gate by mult[j] * scale before xw is added. */
#define LSTM_STEPS(NAME, T, TANH, RINT)                                                                     \
  static VECTOR_CLONES void NAME(const T *xw, const T *rt, const T *mult, T *hs, T *cs, T *y, T *g, T *q,   \
                                 Py_ssize_t batch, Py_ssize_t hid, Py_ssize_t d, Py_ssize_t nd,             \
                                 Py_ssize_t first, Py_ssize_t count, Py_ssize_t step) {                     \
    Py_ssize_t h4 = 4 * hid;                                                                                \
    for (Py_ssize_t n = 0, t = first; n < count; n++, t += step) {                                          \
      for (Py_ssize_t b = 0; b < batch; b++) {                                                              \
        T *gb = g + b * h4;                                                                                 \
        const T *hb = hs + b * hid;                                                                         \
        T scale = 0;                                                                                        \
        if (mult) {                                                                                         \
          T lo = -(T)QUANT_TAU, hi = (T)QUANT_TAU;                                                          \
          for (Py_ssize_t k = 0; k < hid; k++) {                                                            \
            lo = hb[k] < lo ? hb[k] : lo;                                                                   \
            hi = hb[k] > hi ? hb[k] : hi;                                                                   \
          }                                                                                                 \
          scale = (lo - hi) / (T)-255;                                                                      \
          T top = RINT(lo / scale) + (T)255;                                                                \
          for (Py_ssize_t k = 0; k < hid; k++) {                                                            \
            T v = RINT(hb[k] / scale);                                                                      \
            q[k] = v < top ? v : top;                                                                       \
          }                                                                                                 \
          hb = q;                                                                                           \
        }                                                                                                   \
        /* LSTM_TILE gates at a time summed in registers over k, then the rest */                         \
        Py_ssize_t j0 = 0;                                                                                  \
        for (; j0 + LSTM_TILE <= h4; j0 += LSTM_TILE) {                                                     \
          T acc[LSTM_TILE] = {0};                                                                           \
          for (Py_ssize_t k = 0; k < hid; k++) {                                                            \
            T hk = hb[k];                                                                                   \
            const T *rk = rt + k * h4 + j0;                                                                 \
            for (int j = 0; j < LSTM_TILE; j++) acc[j] += hk * rk[j];                                       \
          }                                                                                                 \
          memcpy(gb + j0, acc, sizeof acc);                                                                 \
        }                                                                                                   \
        for (Py_ssize_t j = j0; j < h4; j++) gb[j] = 0;                                                     \
        for (Py_ssize_t k = 0; k < hid && j0 < h4; k++) {                                                   \
          T hk = hb[k];                                                                                     \
          const T *rk = rt + k * h4;                                                                        \
          for (Py_ssize_t j = j0; j < h4; j++) gb[j] += hk * rk[j];                                         \
        }                                                                                                   \
        if (mult)                                                                                           \
          for (Py_ssize_t j = 0; j < h4; j++) gb[j] *= mult[j] * scale;                                     \
        const T *xb = xw + (t * batch + b) * h4;                                                            \
        for (Py_ssize_t j = 0; j < h4; j++) gb[j] += xb[j];                                                 \
      }                                                                                                     \
      TANH(g, batch * h4);                                                                                  \
      for (Py_ssize_t b = 0; b < batch; b++) {                                                              \
        T *gb = g + b * h4, *cb = cs + b * hid;                                                             \
        for (Py_ssize_t j = 0; j < 3 * hid; j++) gb[j] = gb[j] * (T)0.5 + (T)0.5;                          \
        for (Py_ssize_t j = 0; j < hid; j++) cb[j] = gb[j] * gb[3 * hid + j] + gb[hid + j] * cb[j];        \
      }                                                                                                     \
      /* tanh(c) into the (spent) i gate's rows */                                                          \
      for (Py_ssize_t b = 0; b < batch; b++) memcpy(g + b * h4, cs + b * hid, sizeof(T) * (size_t)hid);     \
      for (Py_ssize_t b = 0; b < batch; b++) TANH(g + b * h4, hid);                                         \
      T *yt = y + (t * nd + d) * batch * hid;                                                               \
      for (Py_ssize_t b = 0; b < batch; b++) {                                                              \
        const T *gb = g + b * h4;                                                                           \
        T *hb = hs + b * hid, *yb = yt + b * hid;                                                           \
        for (Py_ssize_t j = 0; j < hid; j++) hb[j] = yb[j] = gb[2 * hid + j] * gb[j];                       \
      }                                                                                                     \
    }                                                                                                       \
  }
#define QUANT_TAU 7.888609052210118e-31 /* 2^-100 */
LSTM_STEPS(lstm_steps_float, float, tanh_floats, rintf)
LSTM_STEPS(lstm_steps_double, double, tanh_doubles, rint)

/* lstm_steps(xw, rt, h, c, y, d, first, count, step[, mult]): see LSTM_STEPS. xw [seq, batch,
 * 4 hidden], rt [hidden, 4 hidden], h and c [batch, hidden] (in and out), y [seq, directions,
 * batch, hidden], mult [4 hidden] (or None); all float32 or all float64, C-contiguous. */
static PyObject *lstm_steps(PyObject *module, PyObject *args) {
  PyObject *o_xw, *o_rt, *o_h, *o_c, *o_y, *o_mult = Py_None;
  Py_ssize_t d, first, count, step;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOOOOnnnn|O", &o_xw, &o_rt, &o_h, &o_c, &o_y, &d, &first, &count, &step, &o_mult))
    return NULL;
  Py_buffer bx, br, bh, bc, by, bm;
  int held = 0;
  PyObject *result = NULL;
  void *g = NULL;
  /* h first, for the type and the shape the others must have */
  if (PyObject_GetBuffer(o_h, &bh, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) return NULL;
  held = 1;
  const char *hf = bh.format ? bh.format : "B";
  if (hf[0] == '<' || hf[0] == '=' || hf[0] == '@') hf++;
  if (bh.ndim != 2 || strlen(hf) != 1 || !strchr("fd", hf[0]) || bh.itemsize != (hf[0] == 'f' ? 4 : 8)) {
    PyErr_SetString(PyExc_ValueError, "lstm_steps: h must be [batch, hidden] float32 or float64, C-contiguous");
    goto done;
  }
  Py_ssize_t size = bh.itemsize;
  const char *fmt = size == 4 ? "f" : "d";
  Py_ssize_t batch = bh.shape[0], hid = bh.shape[1];
  if (get_buffer(o_c, &bc, "c", size, fmt, batch * hid, 1) < 0) goto done;
  held = 2;
  if (get_buffer(o_rt, &br, "rt", size, fmt, hid * 4 * hid, 0) < 0) goto done;
  held = 3;
  if (get_buffer(o_xw, &bx, "xw", size, fmt, -1, 0) < 0) goto done;
  held = 4;
  if (get_buffer(o_y, &by, "y", size, fmt, -1, 1) < 0) goto done;
  held = 5;
  if (o_mult != Py_None) {
    if (get_buffer(o_mult, &bm, "mult", size, fmt, 4 * hid, 0) < 0) goto done;
    held = 6;
  }
  Py_ssize_t row = batch * hid;
  if (!row || bx.len % (4 * row * size) || by.ndim != 4 || by.shape[2] != batch || by.shape[3] != hid) {
    PyErr_SetString(PyExc_ValueError, "lstm_steps: xw must be [seq, batch, 4 hidden], y [seq, directions, batch, "
                    "hidden]");
    goto done;
  }
  Py_ssize_t seq = bx.len / (4 * row * size), nd = by.shape[1];
  Py_ssize_t last = first + (count - 1) * step;
  if (by.shape[0] != seq || d < 0 || d >= nd || count < 0 || (step != 1 && step != -1) ||
      (count && (first < 0 || first >= seq || last < 0 || last >= seq))) {
    PyErr_Format(PyExc_ValueError, "lstm_steps: steps %zd + %zd x %zd outside [0, %zd) or direction %zd outside "
                 "[0, %zd)", first, count, step, seq, d, nd);
    goto done;
  }
  g = PyMem_Malloc((size_t)((4 * row + hid) * size)); /* the gates, then one row's codes */
  if (!g) {
    PyErr_NoMemory();
    goto done;
  }
  PyThreadState *ts = count * row * hid > 65536 ? PyEval_SaveThread() : NULL;
  const void *mult = held >= 6 ? bm.buf : NULL;
  if (size == 4)
    lstm_steps_float(bx.buf, br.buf, mult, bh.buf, bc.buf, by.buf, g, (float *)g + 4 * row, batch, hid, d, nd, first,
                     count, step);
  else
    lstm_steps_double(bx.buf, br.buf, mult, bh.buf, bc.buf, by.buf, g, (double *)g + 4 * row, batch, hid, d, nd,
                      first, count, step);
  if (ts) PyEval_RestoreThread(ts);
  Py_INCREF(Py_None);
  result = Py_None;
done:
  PyMem_Free(g);
  if (held >= 6) PyBuffer_Release(&bm);
  if (held >= 5) PyBuffer_Release(&by);
  if (held >= 4) PyBuffer_Release(&bx);
  if (held >= 3) PyBuffer_Release(&br);
  if (held >= 2) PyBuffer_Release(&bc);
  if (held >= 1) PyBuffer_Release(&bh);
  return result;
}

/* out[j] = sum over k of hb[k] rt[k * stride + j], for j in [j0, j1): 32, then 16, then 8 sums at a
 * time in registers over k (in k order, as LSTM_STEPS), then the rest in memory; GRU's 3 hidden
 * gates are seldom a multiple of 32, and the rest's loop, a store and load a k, took 40% of a step
 * at hidden 16. Inlined into each clone. */
#define ROW_TILES(T, W)                                                                                     \
  for (; j0 + (W) <= j1; j0 += (W)) {                                                                      \
    T acc[W] = {0};                                                                                         \
    for (Py_ssize_t k = 0; k < hid; k++) {                                                                  \
      T hk = hb[k];                                                                                         \
      const T *rk = rt + k * stride + j0;                                                                   \
      for (int j = 0; j < (W); j++) acc[j] += hk * rk[j];                                                   \
    }                                                                                                       \
    memcpy(out + j0, acc, sizeof acc);                                                                      \
  }
#define ROW_PRODUCT(NAME, T)                                                                                \
  static inline ALWAYS_INLINE void NAME(const T *hb, const T *rt, T *out, Py_ssize_t hid, Py_ssize_t stride,  \
                                        Py_ssize_t j0, Py_ssize_t j1) {                                     \
    ROW_TILES(T, LSTM_TILE)                                                                                 \
    ROW_TILES(T, LSTM_TILE / 2)                                                                             \
    ROW_TILES(T, LSTM_TILE / 4)                                                                             \
    for (Py_ssize_t j = j0; j < j1; j++) out[j] = 0;                                                        \
    for (Py_ssize_t k = 0; k < hid && j0 < j1; k++) {                                                       \
      T hk = hb[k];                                                                                         \
      const T *rk = rt + k * stride;                                                                        \
      for (Py_ssize_t j = j0; j < j1; j++) out[j] += hk * rk[j];                                            \
    }                                                                                                       \
  }
ROW_PRODUCT(row_product_float, float)
ROW_PRODUCT(row_product_double, double)

/* One direction of a GRU in its default form (sigmoid, tanh; no clip), steps first, first + step,
 * ... (count of them), as recurrent.py's GRU._step_transposed a batch row at a time: xw holds the
 * input projections, bias (or NULL) GRU._prepare_direction's bias row, added to them before the R
 * product's sum as numpy's loop adds it (the same bits), rt is its R transposed, [hidden,
 * 3 hidden] (z and r columns halved, so sigmoid = 0.5 + 0.5 tanh). linear_before_reset: n =
 * tanh(xw_n + r (h R_n^T + rbh)), else n = tanh(xw_n + (r h) R_n^T); h = n + z (h - n), written
 * to y[t, d]. With lens, a row whose sequence ended (t >= lens[b]) keeps its state and writes a
 * zero Y (recurrent.masked_step), its step not computed. h holds the initial state on entry and
 * the final one on return. */
/* dst[j] += xb[j] (+ bias[j]) for j < n: a step's input projection and, where the kernel adds it
 * itself, its bias (GRU_STEPS, RNN_STEPS). */
#define ADD_PROJECTION(dst, xb, bias, n)                                                                   \
  do {                                                                                                      \
    if (bias)                                                                                               \
      for (Py_ssize_t j_ = 0; j_ < (n); j_++) (dst)[j_] += (xb)[j_] + (bias)[j_];                           \
    else                                                                                                    \
      for (Py_ssize_t j_ = 0; j_ < (n); j_++) (dst)[j_] += (xb)[j_];                                        \
  } while (0)

#define GRU_STEPS(NAME, T, TANH, PRODUCT)                                                                   \
  static VECTOR_CLONES void NAME(const T *xw, const T *bias, const T *rt, const T *rbh, const int64_t *lens,  \
                                 T *hs, T *y, T *g, T *q, Py_ssize_t batch, Py_ssize_t hid, Py_ssize_t d,   \
                                 Py_ssize_t nd, Py_ssize_t first, Py_ssize_t count, Py_ssize_t step, int lbr) { \
    Py_ssize_t h2 = 2 * hid, h3 = 3 * hid;                                                                  \
    for (Py_ssize_t n = 0, t = first; n < count; n++, t += step) {                                         \
      for (Py_ssize_t b = 0; b < batch; b++) {                                                             \
        T *hb = hs + b * hid, *yb = y + ((t * nd + d) * batch + b) * hid;                                   \
        if (lens && t >= lens[b]) {                                                                         \
          for (Py_ssize_t j = 0; j < hid; j++) yb[j] = 0;                                                   \
          continue;                                                                                         \
        }                                                                                                   \
        const T *xb = xw + (t * batch + b) * h3;                                                            \
        PRODUCT(hb, rt, g, hid, h3, 0, lbr ? h3 : h2);                                                      \
        ADD_PROJECTION(g, xb, bias, h2);                                                                    \
        TANH(g, h2);                                                                                        \
        for (Py_ssize_t j = 0; j < h2; j++) g[j] = g[j] * (T)0.5 + (T)0.5;                                 \
        T *gn = g + h2;                                                                                     \
        if (lbr) {                                                                                          \
          if (rbh)                                                                                          \
            for (Py_ssize_t j = 0; j < hid; j++) gn[j] += rbh[j];                                           \
          for (Py_ssize_t j = 0; j < hid; j++) gn[j] = g[hid + j] * gn[j];                                  \
        } else {                                                                                            \
          for (Py_ssize_t j = 0; j < hid; j++) q[j] = g[hid + j] * hb[j];                                   \
          PRODUCT(q, rt, g, hid, h3, h2, h3);                                                               \
        }                                                                                                   \
        ADD_PROJECTION(gn, xb + h2, bias ? bias + h2 : NULL, hid);                                          \
        TANH(gn, hid);                                                                                      \
        for (Py_ssize_t j = 0; j < hid; j++) hb[j] = yb[j] = gn[j] + g[j] * (hb[j] - gn[j]);               \
      }                                                                                                     \
    }                                                                                                       \
  }
GRU_STEPS(gru_steps_float, float, tanh_floats, row_product_float)
GRU_STEPS(gru_steps_double, double, tanh_doubles, row_product_double)

/* One direction of an RNN in its default form (tanh, no clip), as GRU_STEPS: h = tanh(xw + bias +
 * h R^T), rt R transposed, [hidden, hidden]; rows at or past their lens skipped alike. */
#define RNN_STEPS(NAME, T, TANH, PRODUCT)                                                                   \
  static VECTOR_CLONES void NAME(const T *xw, const T *bias, const T *rt, const int64_t *lens, T *hs, T *y, \
                                 T *g, Py_ssize_t batch, Py_ssize_t hid, Py_ssize_t d, Py_ssize_t nd,       \
                                 Py_ssize_t first, Py_ssize_t count, Py_ssize_t step) {                     \
    for (Py_ssize_t n = 0, t = first; n < count; n++, t += step) {                                         \
      for (Py_ssize_t b = 0; b < batch; b++) {                                                             \
        T *hb = hs + b * hid, *yb = y + ((t * nd + d) * batch + b) * hid;                                   \
        if (lens && t >= lens[b]) {                                                                         \
          for (Py_ssize_t j = 0; j < hid; j++) yb[j] = 0;                                                   \
          continue;                                                                                         \
        }                                                                                                   \
        const T *xb = xw + (t * batch + b) * hid;                                                           \
        PRODUCT(hb, rt, g, hid, hid, 0, hid);                                                               \
        ADD_PROJECTION(g, xb, bias, hid);                                                                   \
        TANH(g, hid);                                                                                       \
        for (Py_ssize_t j = 0; j < hid; j++) hb[j] = yb[j] = g[j];                                          \
      }                                                                                                     \
    }                                                                                                       \
  }
RNN_STEPS(rnn_steps_float, float, tanh_floats, row_product_float)
RNN_STEPS(rnn_steps_double, double, tanh_doubles, row_product_double)

/* gru_steps (gates 3) and rnn_steps (gates 1).
 * gru_steps(xw, rt, h, y, d, first, count, step, linear_before_reset, rbh, lens[, bias]): see
 * GRU_STEPS. xw [seq, batch, 3 hidden], rt [hidden, 3 hidden], h [batch, hidden] (in and out), y
 * [seq, directions, batch, hidden], rbh [hidden] or None, lens int64 [batch] or None, bias
 * [3 hidden] or None; the floats all float32 or all float64, C-contiguous. */
static PyObject *recurrent_steps(PyObject *args, Py_ssize_t gates) {
  const char *name = gates == 3 ? "gru_steps" : "rnn_steps";
  PyObject *o_xw, *o_rt, *o_h, *o_y, *o_rbh = Py_None, *o_lens, *o_bias = Py_None;
  Py_ssize_t d, first, count, step;
  int lbr = 0;
  if (gates == 3 ? !PyArg_ParseTuple(args, "OOOOnnnnpOO|O", &o_xw, &o_rt, &o_h, &o_y, &d, &first, &count, &step, &lbr,
                                     &o_rbh, &o_lens, &o_bias)
                 : !PyArg_ParseTuple(args, "OOOOnnnnO|O", &o_xw, &o_rt, &o_h, &o_y, &d, &first, &count, &step, &o_lens,
                                     &o_bias))
    return NULL;
  Py_buffer bx, br, bh, by, bb, bl, bs;
  int held = 0, has_rbh = 0, has_lens = 0, has_bias = 0;
  PyObject *result = NULL;
  void *g = NULL;
  /* h first, for the type and the shape the others must have */
  if (PyObject_GetBuffer(o_h, &bh, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) return NULL;
  held = 1;
  const char *hf = bh.format ? bh.format : "B";
  if (hf[0] == '<' || hf[0] == '=' || hf[0] == '@') hf++;
  if (bh.ndim != 2 || strlen(hf) != 1 || !strchr("fd", hf[0]) || bh.itemsize != (hf[0] == 'f' ? 4 : 8)) {
    PyErr_Format(PyExc_ValueError, "%s: h must be [batch, hidden] float32 or float64, C-contiguous", name);
    goto done;
  }
  Py_ssize_t size = bh.itemsize;
  const char *fmt = size == 4 ? "f" : "d";
  Py_ssize_t batch = bh.shape[0], hid = bh.shape[1];
  if (get_buffer(o_rt, &br, "rt", size, fmt, hid * gates * hid, 0) < 0) goto done;
  held = 2;
  if (get_buffer(o_xw, &bx, "xw", size, fmt, -1, 0) < 0) goto done;
  held = 3;
  if (get_buffer(o_y, &by, "y", size, fmt, -1, 1) < 0) goto done;
  held = 4;
  if (o_rbh != Py_None) {
    if (get_buffer(o_rbh, &bb, "rbh", size, fmt, hid, 0) < 0) goto done;
    has_rbh = 1;
  }
  if (o_lens != Py_None) {
    if (get_buffer(o_lens, &bl, "lens", 8, "lq", batch, 0) < 0) goto done;
    has_lens = 1;
  }
  if (o_bias != Py_None) {
    if (get_buffer(o_bias, &bs, "bias", size, fmt, gates * hid, 0) < 0) goto done;
    has_bias = 1;
  }
  Py_ssize_t row = batch * hid;
  if (!row || bx.len % (gates * row * size) || by.ndim != 4 || by.shape[2] != batch || by.shape[3] != hid) {
    PyErr_Format(PyExc_ValueError, "%s: xw must be [seq, batch, %zd hidden], y [seq, directions, batch, hidden]", name,
                 gates);
    goto done;
  }
  Py_ssize_t seq = bx.len / (gates * row * size), nd = by.shape[1];
  Py_ssize_t last = first + (count - 1) * step;
  if (by.shape[0] != seq || d < 0 || d >= nd || count < 0 || (step != 1 && step != -1) ||
      (count && (first < 0 || first >= seq || last < 0 || last >= seq))) {
    PyErr_Format(PyExc_ValueError, "%s: steps %zd + %zd x %zd outside [0, %zd) or direction %zd outside [0, %zd)",
                 name, first, count, step, seq, d, nd);
    goto done;
  }
  g = PyMem_Malloc((size_t)(4 * hid * size)); /* one row's gates, then r h */
  if (!g) {
    PyErr_NoMemory();
    goto done;
  }
  PyThreadState *ts = count * row * hid > 65536 ? PyEval_SaveThread() : NULL;
  const void *rbh = has_rbh ? bb.buf : NULL;
  const int64_t *lens = has_lens ? bl.buf : NULL;
  const void *bias = has_bias ? bs.buf : NULL;
  if (gates == 1 && size == 4)
    rnn_steps_float(bx.buf, bias, br.buf, lens, bh.buf, by.buf, g, batch, hid, d, nd, first, count, step);
  else if (gates == 1)
    rnn_steps_double(bx.buf, bias, br.buf, lens, bh.buf, by.buf, g, batch, hid, d, nd, first, count, step);
  else if (size == 4)
    gru_steps_float(bx.buf, bias, br.buf, rbh, lens, bh.buf, by.buf, g, (float *)g + 3 * hid, batch, hid, d, nd,
                    first, count, step, lbr);
  else
    gru_steps_double(bx.buf, bias, br.buf, rbh, lens, bh.buf, by.buf, g, (double *)g + 3 * hid, batch, hid, d, nd,
                     first, count, step, lbr);
  if (ts) PyEval_RestoreThread(ts);
  Py_INCREF(Py_None);
  result = Py_None;
done:
  PyMem_Free(g);
  if (has_bias) PyBuffer_Release(&bs);
  if (has_lens) PyBuffer_Release(&bl);
  if (has_rbh) PyBuffer_Release(&bb);
  if (held >= 4) PyBuffer_Release(&by);
  if (held >= 3) PyBuffer_Release(&bx);
  if (held >= 2) PyBuffer_Release(&br);
  if (held >= 1) PyBuffer_Release(&bh);
  return result;
}

static PyObject *gru_steps(PyObject *module, PyObject *args) {
  (void)module;
  return recurrent_steps(args, 3);
}

/* rnn_steps(xw, rt, h, y, d, first, count, step, lens[, bias]): see RNN_STEPS; as gru_steps with
 * xw [seq, batch, hidden], rt [hidden, hidden], bias [hidden] or None. */
static PyObject *rnn_steps(PyObject *module, PyObject *args) {
  (void)module;
  return recurrent_steps(args, 1);
}

#define HARD_SWISH(NAME, T)                                                                                  \
  static VECTOR_CLONES void NAME(T *RESTRICT y, Py_ssize_t n, T alpha, T beta) {                           \
    for (Py_ssize_t i = 0; i < n; i++) {                                                                    \
      T t = y[i] * alpha;                                                                                   \
      t = t + beta;                                                                                         \
      t = t < 0 ? (T)0 : t;                                                                                 \
      t = t > 1 ? (T)1 : t;                                                                                 \
      y[i] = y[i] * t;                                                                                      \
    }                                                                                                       \
  }
HARD_SWISH(hard_swish_float, float)
HARD_SWISH(hard_swish_double, double)

/* hard_swish(y, alpha, beta): y *= min(max(alpha y + beta, 0), 1) in place, in y's type, the
 * operations and their rounding those of fused.py's numpy hard_swish (multiply, add, clip, multiply;
 * NaN stays NaN): the same values in one pass where numpy takes four and a temporary. */
static PyObject *hard_swish(PyObject *module, PyObject *args) {
  PyObject *o_y;
  double alpha, beta;
  (void)module;
  if (!PyArg_ParseTuple(args, "Odd", &o_y, &alpha, &beta)) return NULL;
  Py_buffer by;
  if (PyObject_GetBuffer(o_y, &by, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) return NULL;
  const char *f = by.format ? by.format : "B";
  if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
  if (strlen(f) != 1 || !strchr("fd", f[0]) || by.itemsize != (f[0] == 'f' ? 4 : 8)) {
    PyBuffer_Release(&by);
    PyErr_SetString(PyExc_ValueError, "hard_swish: y must be float32 or float64, C-contiguous and writable");
    return NULL;
  }
  Py_ssize_t n = by.len / by.itemsize;
  if (by.itemsize == 4)
    hard_swish_float(by.buf, n, (float)alpha, (float)beta);
  else
    hard_swish_double(by.buf, n, alpha, beta);
  PyBuffer_Release(&by);
  Py_RETURN_NONE;
}

/* platt(scores, prob_a, prob_b, v): libsvm's pairwise probabilities from the pairwise scores as
 * ml_svm.py's _platt_pairs computes them (its canonical form), in float: x = s a + b, w = 1 / (1 +
 * exp(-|x|)), r = 1 - w where x >= 0 else w, clipped to [1e-7, 1 - 1e-7]; NaN stays NaN. scores
 * and v float32 [rows, pairs], prob_a and prob_b float32 [pairs]. */
static PyObject *platt(PyObject *module, PyObject *args) {
  PyObject *o_s, *o_a, *o_b, *o_v;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOOO", &o_s, &o_a, &o_b, &o_v)) return NULL;
  Py_buffer bs, ba, bb, bv;
  int held = 0;
  PyObject *result = NULL;
  if (get_buffer(o_a, &ba, "prob_a", 4, "f", -1, 0) < 0) return NULL;
  held = 1;
  Py_ssize_t pairs = ba.len / 4;
  if (get_buffer(o_b, &bb, "prob_b", 4, "f", pairs, 0) < 0) goto done;
  held = 2;
  if (get_buffer(o_s, &bs, "scores", 4, "f", -1, 0) < 0) goto done;
  held = 3;
  if (!pairs || bs.ndim != 2 || bs.shape[1] != pairs) {
    PyErr_SetString(PyExc_ValueError, "platt: scores must be [rows, pairs] float32, prob_a and prob_b [pairs]");
    goto done;
  }
  if (get_buffer(o_v, &bv, "v", 4, "f", bs.len / 4, 1) < 0) goto done;
  held = 4;
  const float *sc = bs.buf, *pa = ba.buf, *pb = bb.buf;
  float *v = bv.buf;
  for (Py_ssize_t n = 0, rows = bs.len / (pairs * 4); n < rows; n++)
    for (Py_ssize_t c = 0; c < pairs; c++) {
      float x = sc[n * pairs + c] * pa[c];
      x = x + pb[c];
      float w = 1.0f / (1.0f + expf(-fabsf(x)));
      float r = x >= 0 ? 1.0f - w : w;
      const float low = (float)1e-7, high = (float)(1 - 1e-7); /* libsvm's clip, as numpy rounds it */
      if (r == r) r = r < low ? low : (r > high ? high : r);
      v[n * pairs + c] = r;
    }
  Py_INCREF(Py_None);
  result = Py_None;
done:
  if (held >= 4) PyBuffer_Release(&bv);
  if (held >= 3) PyBuffer_Release(&bs);
  if (held >= 2) PyBuffer_Release(&bb);
  if (held >= 1) PyBuffer_Release(&ba);
  return result;
}

/* A direct convolution, NCHW, for depthwise and few-channel layers (fused_conv.py). Per image and
 * group, each input channel's plane is first laid out in `s` with its padding as zeros and split
 * into the sh x sw phases of the strides: phase (fi, fj) holds the padded rows fi, fi + sh, ...
 * and of each the columns fj, fj + sw, ..., hv rows of wv (the outputs' oh x ow plus the farthest
 * tap's offset within the phase). Tap (i, j) then reads, for every output, the phase
 * ((i dh) % sh, (j dw) % sw) from row (i dh) / sh and column (j dw) / sw on: one block of the
 * same pitch as an accumulator of oh rows of wv, so each channel's tap is one multiply-add loop
 * over the whole plane, which the compiler vectorizes (the wv - ow columns past each row's
 * outputs are computed and dropped, and so are those of the last tile past the plane; the layout
 * keeps a slack of a row of wv and DW_TILE after its end for their reads). The layout
 * is zeroed once per call: the padding lies at the same places in every channel's, and only the
 * input's values are written. Per output channel: the bias, then the group's channels in order, each one's taps
 * in row-major order; the rows of the accumulator's first ow columns are the output. */
#define DW_TILE 64 /* outputs summed in registers at a time: 4 AVX-512 vectors of floats */
#define DC_BLOCK 4 /* output channels summed at a time, where a group has as many */
/* A row of n outputs from the accumulators a to d, through the activation: DC_NONE; DC_CLAMP to
 * [p0, p1] (Relu: [0, inf]), maximum then minimum, NaN kept (numpy's clip and maximum); DC_HARD_SWISH
 * v min(max(p0 v + p1, 0), 1), each operation rounded in T as fused.py's numpy hard_swish does
 * (by hard_swish_float/double, defined above). */
enum { DC_NONE = 0, DC_CLAMP = 1, DC_HARD_SWISH = 2 };
/* 1 where act is one of the above, else 0 with "KERNEL: act must be ..." as the ValueError */
static int conv_act_ok(int act, const char *kernel) {
  if (act >= DC_NONE && act <= DC_HARD_SWISH) return 1;
  PyErr_Format(PyExc_ValueError, "%s: act must be 0 (none), 1 (clamp) or 2 (hard swish)", kernel);
  return 0;
}
#define DC_STORE(T, d, a, n, act, p0, p1)                                                                   \
  do {                                                                                                      \
    T *RESTRICT d_ = (d);                                                                                   \
    const T *RESTRICT a_ = (a);                                                                             \
    if ((act) == DC_CLAMP)                                                                                  \
      for (Py_ssize_t i_ = 0; i_ < (n); i_++) {                                                             \
        T v_ = a_[i_] < (p0) ? (p0) : a_[i_];                                                               \
        d_[i_] = v_ > (p1) ? (p1) : v_;                                                                     \
      }                                                                                                     \
    else if ((act) == DC_HARD_SWISH) {                                                                      \
      /* hard_swish_float/double, built without FMA contraction: the convolutions' clones                   \
       * contract, and a multiply-add here would round unlike numpy's hard_swish */                         \
      for (Py_ssize_t i_ = 0; i_ < (n); i_++) d_[i_] = a_[i_];                                              \
      _Generic(d_, float *: hard_swish_float, double *: hard_swish_double)(d_, (n), (p0), (p1));            \
    }                                                                                                       \
    else                                                                                                    \
      for (Py_ssize_t i_ = 0; i_ < (n); i_++) d_[i_] = a_[i_];                                              \
  } while (0)
/* outputs of each of them summed in registers at a time: 16 AVX-512 vectors over the DC_BLOCK
 * channels, 64 floats or 32 doubles (the slack past the plane, DW_TILE, holds a tile's reads) */
#define DC_TILE(T) ((int)(256 / sizeof(T)))
/* output channels summed at a time ahead of the DC_BLOCK ones, where a group has as many: 24 AVX-512
 * accumulators, 6 weights and a row vector within the 32 registers, each row vector loaded feeding
 * 6 sums, and the loop's index work spread over 24 multiply-adds where DC_BLOCK's has 16. Their
 * weights are packed per block in the order the taps are summed (pk), one pointer stepping by
 * DC_WIDE, where DC_BLOCK's four weights are gathered at strides of C kh kw. */
#define DC_WIDE 6
/* Where the wide blocks are taken: at least DC_WIDE_MIN_SUMS products per output (C kh kw over the
 * live taps) and DC_WIDE_MIN_PLANE outputs a plane (layout columns included). On shorter sums and
 * smaller planes the six accumulator planes' stores and the packing cost more than the wider block
 * saves (one thread, CPU time against DC_BLOCK alone: 64 to 64 channels 3x3 at 112x112 0.85, 56x56
 * 0.88, 32 to 64 at 32x32 0.92, 16 to 16 at 64x64 0.98; a 3-channel stem at 224x224 1.16, 8 to 16
 * at 32x32 1.07, 64 to 64 at 8x8 1.09). */
#define DC_WIDE_MIN_SUMS 128
#define DC_WIDE_MIN_PLANE 1024
/* On small planes (under DC_WIDE_MIN_PLANE), blocks of DC_NARROW output channels over tiles of half
 * DC_TILE's outputs: 16 AVX-512 accumulators as DC_BLOCK's, but a plane of 8 rows of 10 layout
 * columns is three tiles of 32 where it was two of 64 (96 sums for 80, not 128), and each loaded
 * row vector feeds 8 sums. Weights packed as the wide blocks'. */
#define DC_NARROW 8
#define DC_NARROW_TILE(T) ((int)(128 / sizeof(T)))
/* ... and on sums of at most DC_NARROW_MAX_SUMS products, whose packed weights (8 per product) stay
 * in L1 (one thread, CPU time against DC_BLOCK alone: 64 to 64 channels 3x3 at 8x8 0.89, 32 to 64
 * 0.86, 32 to 32 at 16x16 0.83, 128 to 128 at 14x14 0.95; 256 to 256 at 7x7, 2304 products, 1.47). */
#define DC_NARROW_MAX_SUMS 1152
/* The wide blocks a group of mg output channels takes: as many as leave a multiple of DC_BLOCK
 * behind (32 channels: 4 of 6 and 2 of 4, not 5 and two channels one at a time), where there is such. */
static inline Py_ssize_t dc_wide_blocks(Py_ssize_t mg) {
  for (Py_ssize_t k = mg / DC_WIDE; k >= 0; k--)
    if ((mg - k * DC_WIDE) % DC_BLOCK == 0) return k;
  return mg / DC_WIDE;
}
#define DIRECT_CONV(NAME, T)                                                                                 \
  static CONV_CLONES void NAME(const T *RESTRICT x, const T *RESTRICT w, const T *RESTRICT b,              \
                                 T *RESTRICT y, T *RESTRICT s, T *RESTRICT acc, T *RESTRICT pk,             \
                                 const Py_ssize_t *tap,                                                     \
                                 const Py_ssize_t *wix, Py_ssize_t live,                                    \
                                 Py_ssize_t n, Py_ssize_t c, Py_ssize_t m, Py_ssize_t group,                \
                                 Py_ssize_t h, Py_ssize_t wd, Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t oh,  \
                                 Py_ssize_t ow, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t pt, Py_ssize_t pl, \
                                 Py_ssize_t hv, Py_ssize_t wv, int act, T p0, T p1) {                       \
    Py_ssize_t plane = oh * wv, cg = c / group, mg = m / group, taps = kh * kw;                             \
    Py_ssize_t pitch = plane + DW_TILE; /* of the DC_BLOCK accumulator planes */                            \
    Py_ssize_t block = sh * sw * hv * wv; /* one channel's phases */                                        \
    for (Py_ssize_t img = 0; img < n; img++)                                                                \
      for (Py_ssize_t g = 0; g < group; g++) {                                                              \
        for (Py_ssize_t cc = 0; cc < cg; cc++) {                                                            \
          const T *RESTRICT xp = x + (img * c + g * cg + cc) * h * wd;                                      \
          if (sw == 2 && wv <= 16) {                                                                        \
            /* short rows: both column phases of a row in one pass over it (as below, but a row's two */    \
            /* short strided copies were most of a small strided plane's layout; over longer rows the */   \
            /* two copies are as fast or faster) */                                                         \
            Py_ssize_t lo0 = pl <= 0 ? 0 : (pl + 1) / 2, lo1 = pl - 1 <= 0 ? 0 : pl / 2;                    \
            Py_ssize_t hi0 = wd - 1 + pl < 0 ? 0 : (wd - 1 + pl) / 2 + 1;                                   \
            Py_ssize_t hi1 = wd - 2 + pl < 0 ? 0 : (wd - 2 + pl) / 2 + 1;                                   \
            if (hi0 > wv) hi0 = wv;                                                                         \
            if (hi1 > wv) hi1 = wv;                                                                         \
            Py_ssize_t lo = lo0 > lo1 ? lo0 : lo1, hi = hi0 < hi1 ? hi0 : hi1;                              \
            if (hi < lo) hi = lo;                                                                           \
            for (Py_ssize_t fi = 0; fi < sh; fi++)                                                          \
              for (Py_ssize_t rv = 0; rv < hv; rv++) {                                                      \
                Py_ssize_t r = rv * sh + fi - pt;                                                           \
                if (r < 0 || r >= h) continue;                                                              \
                T *RESTRICT d0 = s + cc * block + (fi * 2 * hv + rv) * wv;                                  \
                T *RESTRICT d1 = d0 + hv * wv;                                                              \
                const T *RESTRICT src = xp + r * wd - pl; /* phase fj's column v: src[2 v + fj] */          \
                for (Py_ssize_t v = lo0; v < lo && v < hi0; v++) d0[v] = src[2 * v];                        \
                for (Py_ssize_t v = lo1; v < lo && v < hi1; v++) d1[v] = src[2 * v + 1];                    \
                for (Py_ssize_t v = lo; v < hi; v++) {                                                      \
                  d0[v] = src[2 * v];                                                                       \
                  d1[v] = src[2 * v + 1];                                                                   \
                }                                                                                           \
                for (Py_ssize_t v = hi > lo0 ? hi : lo0; v < hi0; v++) d0[v] = src[2 * v];                  \
                for (Py_ssize_t v = hi > lo1 ? hi : lo1; v < hi1; v++) d1[v] = src[2 * v + 1];              \
              }                                                                                             \
          } else                                                                                            \
          for (Py_ssize_t fj = 0; fj < sw; fj++) {                                                          \
            /* the phase's columns v whose input column v sw + fj - pl is within the row (hoisted: */       \
            /* two divisions a row were most of a small plane's layout) */                                  \
            Py_ssize_t lo = pl - fj <= 0 ? 0 : (pl - fj + sw - 1) / sw;                                     \
            Py_ssize_t hi = wd - 1 + pl - fj < 0 ? 0 : (wd - 1 + pl - fj) / sw + 1;                         \
            if (hi > wv) hi = wv;                                                                           \
            for (Py_ssize_t fi = 0; fi < sh; fi++)                                                          \
              for (Py_ssize_t rv = 0; rv < hv; rv++) {                                                      \
                T *RESTRICT d = s + cc * block + ((fi * sw + fj) * hv + rv) * wv;                           \
                Py_ssize_t r = rv * sh + fi - pt;                                                           \
                /* the padding is the zeros the layout starts with: every channel's lie at the same */       \
                /* places, and only the input's values are written over them */                              \
                if (r < 0 || r >= h || lo >= hi) continue;                                                  \
                const T *RESTRICT src = xp + r * wd + fj - pl;                                              \
                if (sw == 1)                                                                                \
                  for (Py_ssize_t v = lo; v < hi; v++) d[v] = src[v];                                       \
                else if (sw == 2)                                                                           \
                  for (Py_ssize_t v = lo; v < hi; v++) d[v] = src[2 * v];                                   \
                else                                                                                        \
                  for (Py_ssize_t v = lo; v < hi; v++) d[v] = src[v * sw];                                  \
              }                                                                                             \
          }                                                                                                 \
        }                                                                                                   \
        Py_ssize_t mm = 0;                                                                                  \
        Py_ssize_t wide = cg * live >= DC_WIDE_MIN_SUMS && plane >= DC_WIDE_MIN_PLANE ? dc_wide_blocks(mg) : 0; \
        Py_ssize_t narrow = cg * live >= DC_WIDE_MIN_SUMS && cg * live <= DC_NARROW_MAX_SUMS                 \
                            && plane < DC_WIDE_MIN_PLANE ? mg / DC_NARROW : 0;                               \
        for (; mm < narrow * DC_NARROW; mm += DC_NARROW) {                                                  \
          Py_ssize_t mo = g * mg + mm, ct = cg * taps;                                                      \
          const T *RESTRICT wp = w + mo * ct;                                                               \
          for (Py_ssize_t cc = 0; cc < cg; cc++)                                                            \
            for (Py_ssize_t t = 0; t < live; t++)                                                           \
              for (int o = 0; o < DC_NARROW; o++)                                                           \
                pk[(cc * live + t) * DC_NARROW + o] = wp[o * ct + cc * taps + wix[t]];                      \
          for (Py_ssize_t k0 = 0; k0 < plane; k0 += DC_NARROW_TILE(T)) {                                    \
            T a[DC_NARROW][DC_NARROW_TILE(T)];                                                              \
            for (int o = 0; o < DC_NARROW; o++) {                                                           \
              T bo = b ? b[mo + o] : (T)0;                                                                  \
              for (int k = 0; k < DC_NARROW_TILE(T); k++) a[o][k] = bo;                                     \
            }                                                                                               \
            const T *RESTRICT q = pk;                                                                       \
            for (Py_ssize_t cc = 0; cc < cg; cc++)                                                          \
              for (Py_ssize_t t = 0; t < live; t++, q += DC_NARROW) {                                       \
                const T *RESTRICT src = s + cc * block + tap[t] + k0;                                       \
                for (int o = 0; o < DC_NARROW; o++) {                                                       \
                  T wo = q[o];                                                                              \
                  for (int k = 0; k < DC_NARROW_TILE(T); k++) a[o][k] += wo * src[k];                       \
                }                                                                                           \
              }                                                                                             \
            for (int o = 0; o < DC_NARROW; o++)                                                             \
              for (int k = 0; k < DC_NARROW_TILE(T); k++) acc[o * pitch + k0 + k] = a[o][k];                \
          }                                                                                                 \
          for (Py_ssize_t o = 0; o < DC_NARROW; o++) {                                                      \
            T *RESTRICT yp = y + (img * m + mo + o) * oh * ow;                                              \
            const T *RESTRICT ap = acc + o * pitch;                                                         \
            for (Py_ssize_t oy = 0; oy < oh; oy++)                                                          \
              DC_STORE(T, yp + oy * ow, ap + oy * wv, ow, act, p0, p1);                                     \
          }                                                                                                 \
        }                                                                                                   \
        for (; mm < wide * DC_WIDE; mm += DC_WIDE) {                                                        \
          Py_ssize_t mo = g * mg + mm, ct = cg * taps;                                                      \
          const T *RESTRICT wp = w + mo * ct;                                                               \
          for (Py_ssize_t cc = 0; cc < cg; cc++)                                                            \
            for (Py_ssize_t t = 0; t < live; t++)                                                           \
              for (int o = 0; o < DC_WIDE; o++) pk[(cc * live + t) * DC_WIDE + o] = wp[o * ct + cc * taps + wix[t]]; \
          T b0 = b ? b[mo] : (T)0, b1 = b ? b[mo + 1] : (T)0, b2 = b ? b[mo + 2] : (T)0;                    \
          T b3 = b ? b[mo + 3] : (T)0, b4 = b ? b[mo + 4] : (T)0, b5 = b ? b[mo + 5] : (T)0;                \
          for (Py_ssize_t k0 = 0; k0 < plane; k0 += DC_TILE(T)) {                                           \
            T a0[DC_TILE(T)], a1[DC_TILE(T)], a2[DC_TILE(T)], a3[DC_TILE(T)], a4[DC_TILE(T)], a5[DC_TILE(T)]; \
            for (int k = 0; k < DC_TILE(T); k++) {                                                          \
              a0[k] = b0;                                                                                   \
              a1[k] = b1;                                                                                   \
              a2[k] = b2;                                                                                   \
              a3[k] = b3;                                                                                   \
              a4[k] = b4;                                                                                   \
              a5[k] = b5;                                                                                   \
            }                                                                                               \
            const T *RESTRICT q = pk;                                                                       \
            for (Py_ssize_t cc = 0; cc < cg; cc++)                                                          \
              for (Py_ssize_t t = 0; t < live; t++, q += DC_WIDE) {                                         \
                T w0 = q[0], w1 = q[1], w2 = q[2], w3 = q[3], w4 = q[4], w5 = q[5];                         \
                const T *RESTRICT src = s + cc * block + tap[t] + k0;                                       \
                for (int k = 0; k < DC_TILE(T); k++) {                                                      \
                  T v = src[k];                                                                             \
                  a0[k] += w0 * v;                                                                          \
                  a1[k] += w1 * v;                                                                          \
                  a2[k] += w2 * v;                                                                          \
                  a3[k] += w3 * v;                                                                          \
                  a4[k] += w4 * v;                                                                          \
                  a5[k] += w5 * v;                                                                          \
                }                                                                                           \
              }                                                                                             \
            for (int k = 0; k < DC_TILE(T); k++) {                                                          \
              acc[k0 + k] = a0[k];                                                                          \
              acc[pitch + k0 + k] = a1[k];                                                                  \
              acc[2 * pitch + k0 + k] = a2[k];                                                              \
              acc[3 * pitch + k0 + k] = a3[k];                                                              \
              acc[4 * pitch + k0 + k] = a4[k];                                                              \
              acc[5 * pitch + k0 + k] = a5[k];                                                              \
            }                                                                                               \
          }                                                                                                 \
          for (Py_ssize_t o = 0; o < DC_WIDE; o++) {                                                        \
            T *RESTRICT yp = y + (img * m + mo + o) * oh * ow;                                              \
            const T *RESTRICT ap = acc + o * pitch;                                                         \
            for (Py_ssize_t oy = 0; oy < oh; oy++)                                                          \
              DC_STORE(T, yp + oy * ow, ap + oy * wv, ow, act, p0, p1);                                     \
          }                                                                                                 \
        }                                                                                                   \
        /* DC_BLOCK output channels at a time where the group has them (a stem's 3 channels to 64): */      \
        /* each value read feeds DC_BLOCK sums, where one output channel at a time reads it again for */   \
        /* each; every sum adds the same products in the same order as below */                             \
        for (; mm + DC_BLOCK <= mg; mm += DC_BLOCK) {                                                       \
          Py_ssize_t mo = g * mg + mm, ct = cg * taps;                                                      \
          const T *RESTRICT wp = w + mo * ct;                                                               \
          T b0 = b ? b[mo] : (T)0, b1 = b ? b[mo + 1] : (T)0, b2 = b ? b[mo + 2] : (T)0;                    \
          T b3 = b ? b[mo + 3] : (T)0;                                                                      \
          for (Py_ssize_t k0 = 0; k0 < plane; k0 += DC_TILE(T)) {                                           \
            T a0[DC_TILE(T)], a1[DC_TILE(T)], a2[DC_TILE(T)], a3[DC_TILE(T)];                               \
            for (int k = 0; k < DC_TILE(T); k++) {                                                          \
              a0[k] = b0;                                                                                   \
              a1[k] = b1;                                                                                   \
              a2[k] = b2;                                                                                   \
              a3[k] = b3;                                                                                   \
            }                                                                                               \
            for (Py_ssize_t cc = 0; cc < cg; cc++)                                                          \
              for (Py_ssize_t t = 0; t < live; t++) {                                                       \
                Py_ssize_t wi = cc * taps + wix[t];                                                         \
                T w0 = wp[wi], w1 = wp[ct + wi], w2 = wp[2 * ct + wi], w3 = wp[3 * ct + wi];                \
                const T *RESTRICT src = s + cc * block + tap[t] + k0;                                       \
                for (int k = 0; k < DC_TILE(T); k++) {                                                      \
                  T v = src[k];                                                                             \
                  a0[k] += w0 * v;                                                                          \
                  a1[k] += w1 * v;                                                                          \
                  a2[k] += w2 * v;                                                                          \
                  a3[k] += w3 * v;                                                                          \
                }                                                                                           \
              }                                                                                             \
            for (int k = 0; k < DC_TILE(T); k++) {                                                          \
              acc[k0 + k] = a0[k];                                                                          \
              acc[pitch + k0 + k] = a1[k];                                                                  \
              acc[2 * pitch + k0 + k] = a2[k];                                                              \
              acc[3 * pitch + k0 + k] = a3[k];                                                              \
            }                                                                                               \
          }                                                                                                 \
          for (Py_ssize_t o = 0; o < DC_BLOCK; o++) {                                                       \
            T *RESTRICT yp = y + (img * m + mo + o) * oh * ow;                                              \
            const T *RESTRICT ap = acc + o * pitch;                                                         \
            for (Py_ssize_t oy = 0; oy < oh; oy++)                                                          \
              DC_STORE(T, yp + oy * ow, ap + oy * wv, ow, act, p0, p1);                                     \
          }                                                                                                 \
        }                                                                                                   \
        for (; mm < mg; mm++) {                                                                             \
          Py_ssize_t mo = g * mg + mm;                                                                      \
          const T *RESTRICT wp = w + mo * cg * taps;                                                        \
          T bias = b ? b[mo] : (T)0;                                                                        \
          /* DW_TILE accumulators at a time through every channel's taps, in registers; the last */       \
          /* tile runs past the plane into acc's and the layout's slack (its sums there are dropped): */    \
          /* a shorter one would sum its taps in one chain of additions, as slow as a whole tile */        \
          for (Py_ssize_t k0 = 0; k0 < plane; k0 += DW_TILE) {                                              \
            T a[DW_TILE];                                                                                   \
            for (int k = 0; k < DW_TILE; k++) a[k] = bias;                                                  \
            for (Py_ssize_t cc = 0; cc < cg; cc++)                                                          \
              for (Py_ssize_t t = 0; t < live; t++) {                                                       \
                T wt = wp[cc * taps + wix[t]];                                                              \
                const T *RESTRICT src = s + cc * block + tap[t] + k0;                                       \
                for (int k = 0; k < DW_TILE; k++) a[k] += wt * src[k];                                      \
              }                                                                                             \
            for (int k = 0; k < DW_TILE; k++) acc[k0 + k] = a[k];                                           \
          }                                                                                                 \
          T *RESTRICT yp = y + (img * m + mo) * oh * ow;                                                    \
          for (Py_ssize_t oy = 0; oy < oh; oy++) DC_STORE(T, yp + oy * ow, acc + oy * wv, ow, act, p0, p1);  \
        }                                                                                                   \
      }                                                                                                     \
  }
DIRECT_CONV(direct_conv_float, float)
DIRECT_CONV(direct_conv_double, double)

/* direct_conv(x, w, b, y, strides, pads, dilations, group[, act, p0, p1]): x [N, C, H, W], w [M,
 * C / group, KH, KW], b [M] or None, y [N, M, OH, OW] written; all float32 or all float64,
 * C-contiguous; strides and dilations (h, w) at least 1, pads (top, left) at least 0; OH and OW
 * y's (rows or columns wholly in the padding are the bias); act (DC_STORE's, p0 and p1 in y's
 * type) applied as the outputs are written: a fused Relu, Clip or HardSwish without its pass. */
static PyObject *direct_conv(PyObject *module, PyObject *args) {
  PyObject *o_x, *o_w, *o_b, *o_y;
  Py_ssize_t sh, sw, pt, pl, dh, dw, group;
  (void)module;
  int act = DC_NONE;
  double p0 = 0, p1 = 0;
  if (!PyArg_ParseTuple(args, "OOOO(nn)(nn)(nn)n|idd", &o_x, &o_w, &o_b, &o_y, &sh, &sw, &pt, &pl, &dh, &dw, &group,
                        &act, &p0, &p1))
    return NULL;
  if (!conv_act_ok(act, "direct_conv")) return NULL;
  Py_buffer bx, bw, bb, by;
  int held = 0;
  PyObject *result = NULL;
  void *scratch = NULL;
  Py_ssize_t *tap = NULL;
  Py_ssize_t size = get_float_input(o_x, &bx, 4,
                                    "direct_conv: x must be [N, C, H, W] float32 or float64, C-contiguous");
  if (!size) return NULL;
  held = 1;
  Py_ssize_t n = bx.shape[0], c = bx.shape[1], h = bx.shape[2], wd = bx.shape[3];
  const char *fmt = size == 4 ? "f" : "d";
  if (get_buffer(o_w, &bw, "w", size, fmt, -1, 0) < 0) goto done;
  held = 2;
  if (get_buffer(o_y, &by, "y", size, fmt, -1, 1) < 0) goto done;
  held = 3;
  if (bw.ndim != 4 || by.ndim != 4) {
    PyErr_SetString(PyExc_ValueError, "direct_conv: w and y must be 4-D");
    goto done;
  }
  Py_ssize_t m = bw.shape[0];
  if (o_b != Py_None) {
    if (get_buffer(o_b, &bb, "b", size, fmt, m, 0) < 0) goto done;
    held = 4;
  }
  if (group < 1 || c % group || m % group || bw.shape[1] != c / group || by.shape[0] != n || by.shape[1] != m ||
      sh < 1 || sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0) {
    PyErr_SetString(PyExc_ValueError, "direct_conv: w must be [M, C / group, KH, KW] and y [N, M, OH, OW] of x's N "
                    "(group dividing C and M); strides and dilations at least 1, pads at least 0");
    goto done;
  }
  Py_ssize_t kh = bw.shape[2], kw = bw.shape[3], oh = by.shape[2], ow = by.shape[3], cg = c / group;
  const void *bias = held >= 4 ? bb.buf : NULL;
  /* each channel's phases: oh x ow outputs plus the farthest tap's offset within the phase */
  Py_ssize_t hv = oh + ((kh - 1) * dh) / sh, wv = ow + ((kw - 1) * dw) / sw;
  /* the slack: the last tap's dropped columns (a row) and the last tile's reads past the plane */
  Py_ssize_t phases = cg * sh * sw * hv * wv + wv + DW_TILE;
  /* the accumulators of DC_NARROW (the most) channels, then their weights */
  Py_ssize_t planes = DC_NARROW * (oh * wv + DW_TILE);
  scratch = PyMem_Malloc((size_t)(phases + planes + cg * kh * kw * DC_NARROW) * (size_t)size);
  tap = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(2 * kh * kw + 1));
  if (!scratch || !tap) {
    PyErr_NoMemory();
    goto done;
  }
  /* zeros: the padding (written once here, see DIRECT_CONV), and a slack from which the dropped
   * sums read no NaN or subnormal that would slow them */
  memset(scratch, 0, (size_t)phases * (size_t)size);
  /* tap (i, j) reads phase ((i dh) % sh, (j dw) % sw) from row (i dh) / sh, column (j dw) / sw.
   * The taps that read only padding for every output are left out (their products are zeros, as
   * the gather's plan leaves them out): on small planes (a 2x2 output of a 5x5 dilated kernel)
   * they are most of the taps. wix[t]: the weight (i kw + j) of live tap t. */
  Py_ssize_t live = 0, *wix = tap + kh * kw;
  for (Py_ssize_t i = 0; i < kh; i++)
    for (Py_ssize_t j = 0; j < kw; j++) {
      /* rows oy sh + i dh - pt and columns ox sw + j dw - pl of some output within the input */
      Py_ssize_t r0 = i * dh - pt, c0 = j * dw - pl;
      int rows = r0 + (oh - 1) * sh >= 0 && r0 < h && (r0 >= 0 || (-r0 + sh - 1) / sh * sh + r0 < h);
      int cols = c0 + (ow - 1) * sw >= 0 && c0 < wd && (c0 >= 0 || (-c0 + sw - 1) / sw * sw + c0 < wd);
      if (!rows || !cols) continue;
      tap[live] = ((((i * dh) % sh) * sw + (j * dw) % sw) * hv + (i * dh) / sh) * wv + (j * dw) / sw;
      wix[live++] = i * kw + j;
    }
  PyThreadState *ts = n * m * oh * ow * cg * kh * kw > 65536 ? PyEval_SaveThread() : NULL;
  if (size == 4)
    direct_conv_float(bx.buf, bw.buf, bias, by.buf, scratch, (float *)scratch + phases,
                      (float *)scratch + phases + planes, tap, wix, live, n, c, m, group,
                      h, wd, kh, kw, oh, ow, sh, sw, pt, pl, hv, wv, act, (float)p0, (float)p1);
  else
    direct_conv_double(bx.buf, bw.buf, bias, by.buf, scratch, (double *)scratch + phases,
                       (double *)scratch + phases + planes, tap, wix, live, n, c, m,
                       group, h, wd, kh, kw, oh, ow, sh, sw, pt, pl, hv, wv, act, p0, p1);
  if (ts) PyEval_RestoreThread(ts);
  Py_INCREF(Py_None);
  result = Py_None;
done:
  PyMem_Free(tap);
  PyMem_Free(scratch);
  if (held >= 4) PyBuffer_Release(&bb);
  if (held >= 3) PyBuffer_Release(&by);
  if (held >= 2) PyBuffer_Release(&bw);
  if (held >= 1) PyBuffer_Release(&bx);
  return result;
}

/* shifted_conv: an ungrouped unit-stride, undilated convolution over small planes (fused_conv.py's
 * direct_native_shifted). direct_conv's layout keeps the padding columns in every row, so on an
 * 8x8 output its tiles sum 96 cells for 64 outputs (10 columns a row, tiles of 32). Here each
 * input channel is laid out as kw copies of its padded rows, copy j shifted left by j columns and
 * only ow wide (the cells a shift moves past a row's end are the padding's zeros): tap (i, j) reads
 * copy j from row i on, and every output position of the plane is one contiguous run, so a tile of
 * SC_LANES(T) x nv cells sums only outputs (the last tile's cells past the plane are dropped). A
 * block of mb output channels x nv vectors of the plane is summed in registers (24 AVX-512
 * accumulators: 6 x 4, 12 x 2 or 24 x 1, as MLAS's SGEMM kernels hold a block of C), each input
 * vector loaded feeding mb sums and each weight broadcast feeding nv. Per output: the bias, then
 * the channels in order, each one's live taps in row-major order, as direct_conv; the rows of the
 * output plane are the accumulator's (no padding columns to drop). */
#define SC_LANES(T) ((Py_ssize_t)(64 / sizeof(T))) /* one AVX-512 vector */
typedef float sc_vf __attribute__((vector_size(64), aligned(4)));
typedef double sc_vd __attribute__((vector_size(64), aligned(8)));
#define SC_UNROLL _Pragma("GCC unroll 32")
#define SC_BLOCK(NAME, T, V, NV, MB)                                                                         \
  static inline ALWAYS_INLINE void NAME(const T *RESTRICT s, const T *RESTRICT pk, const T *RESTRICT b,      \
                                        T *RESTRICT acc, const Py_ssize_t *tap, Py_ssize_t live,             \
                                        Py_ssize_t cg, Py_ssize_t block, Py_ssize_t plane, Py_ssize_t pitch) { \
    for (Py_ssize_t k0 = 0; k0 < plane; k0 += (NV) * SC_LANES(T)) {                                         \
      V a[MB][NV];                                                                                          \
      SC_UNROLL for (int o = 0; o < (MB); o++) {                                                            \
        T bo = b ? b[o] : (T)0;                                                                             \
        SC_UNROLL for (int v = 0; v < (NV); v++) a[o][v] = (V){0} + bo;                                     \
      }                                                                                                     \
      const T *RESTRICT q = pk;                                                                             \
      for (Py_ssize_t cc = 0; cc < cg; cc++)                                                                \
        for (Py_ssize_t t = 0; t < live; t++, q += (MB)) {                                                  \
          const T *RESTRICT src = s + cc * block + tap[t] + k0;                                             \
          V xv[NV];                                                                                         \
          SC_UNROLL for (int v = 0; v < (NV); v++) xv[v] = *(const V *)(src + v * SC_LANES(T));             \
          SC_UNROLL for (int o = 0; o < (MB); o++) {                                                        \
            T wo = q[o];                                                                                    \
            SC_UNROLL for (int v = 0; v < (NV); v++) a[o][v] += wo * xv[v];                                 \
          }                                                                                                 \
        }                                                                                                   \
      SC_UNROLL for (int o = 0; o < (MB); o++)                                                              \
        SC_UNROLL for (int v = 0; v < (NV); v++) *(V *)(acc + o * pitch + k0 + v * SC_LANES(T)) = a[o][v];   \
    }                                                                                                       \
  }
SC_BLOCK(sc_float_4x6, float, sc_vf, 4, 6)
SC_BLOCK(sc_float_4x4, float, sc_vf, 4, 4)
SC_BLOCK(sc_float_4x1, float, sc_vf, 4, 1)
SC_BLOCK(sc_float_2x12, float, sc_vf, 2, 12)
SC_BLOCK(sc_float_2x4, float, sc_vf, 2, 4)
SC_BLOCK(sc_float_2x1, float, sc_vf, 2, 1)
SC_BLOCK(sc_float_1x24, float, sc_vf, 1, 24)
SC_BLOCK(sc_float_1x4, float, sc_vf, 1, 4)
SC_BLOCK(sc_float_1x1, float, sc_vf, 1, 1)
SC_BLOCK(sc_double_4x6, double, sc_vd, 4, 6)
SC_BLOCK(sc_double_4x4, double, sc_vd, 4, 4)
SC_BLOCK(sc_double_4x1, double, sc_vd, 4, 1)
SC_BLOCK(sc_double_2x12, double, sc_vd, 2, 12)
SC_BLOCK(sc_double_2x4, double, sc_vd, 2, 4)
SC_BLOCK(sc_double_2x1, double, sc_vd, 2, 1)
SC_BLOCK(sc_double_1x24, double, sc_vd, 1, 24)
SC_BLOCK(sc_double_1x4, double, sc_vd, 1, 4)
SC_BLOCK(sc_double_1x1, double, sc_vd, 1, 1)
/* the vectors of the plane a tile spans: 4, or 2 where those tiles sum fewer cells (a 12x12 plane:
 * 10 vectors, where tiles of 4 would sum 12), 1 on planes of one vector. Blocks of 24 channels
 * over one vector broadcast a weight per multiply-add and lost to direct_conv (14x14 planes: 1.56
 * of its time), so wider planes keep tiles of 2 or 4. */
static inline Py_ssize_t sc_vectors(Py_ssize_t plane, Py_ssize_t lanes) {
  if (plane <= lanes) return 1;
  return (plane + 2 * lanes - 1) / (2 * lanes) * 2 < (plane + 4 * lanes - 1) / (4 * lanes) * 4 ? 2 : 4;
}
#define SHIFTED_CONV(NAME, T, B4W, B4Q, B4N, B2W, B2Q, B2N, B1W, B1Q, B1N)                                   \
  static CONV_CLONES void NAME(const T *RESTRICT x, const T *RESTRICT w, const T *RESTRICT b,              \
                                 T *RESTRICT y, T *RESTRICT s, T *RESTRICT acc, T *RESTRICT pks,            \
                                 const Py_ssize_t *tap, const Py_ssize_t *wix, Py_ssize_t live,             \
                                 Py_ssize_t n, Py_ssize_t c, Py_ssize_t m, Py_ssize_t h, Py_ssize_t wd,     \
                                 Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t oh, Py_ssize_t ow,                \
                                 Py_ssize_t pt, Py_ssize_t pl, Py_ssize_t pitch, int act, T p0, T p1) {     \
    Py_ssize_t plane = oh * ow, hv = oh + kh - 1, block = kw * hv * ow, taps = kh * kw;                     \
    Py_ssize_t nv = sc_vectors(plane, SC_LANES(T)), mb = nv == 4 ? 6 : nv == 2 ? 12 : 24;                             \
    /* the weights per block of output channels, tap-major then channel within the block, as the */      \
    /* blocks read them (the last m % mb channels in blocks of 4, then one at a time: a lone */            \
    /* channel's sums over one vector are one chain of dependent multiply-adds) */                       \
    for (Py_ssize_t mo = 0; mo < m;) {                                                                      \
      Py_ssize_t cur = m - mo >= mb ? mb : m - mo >= 4 ? 4 : 1, ct = c * taps;                                                \
      T *RESTRICT pk = pks + mo * c * live;                                                                 \
      for (Py_ssize_t o = 0; o < cur; o++)                                                                  \
        for (Py_ssize_t cc = 0; cc < c; cc++)                                                               \
          for (Py_ssize_t t = 0; t < live; t++) pk[(cc * live + t) * cur + o] = w[(mo + o) * ct + cc * taps + wix[t]]; \
      mo += cur;                                                                                            \
    }                                                                                                       \
    for (Py_ssize_t img = 0; img < n; img++) {                                                              \
      for (Py_ssize_t cc = 0; cc < c; cc++) {                                                               \
        const T *RESTRICT xp = x + (img * c + cc) * h * wd;                                                 \
        for (Py_ssize_t j = 0; j < kw; j++) {                                                               \
          /* copy j's column v holds input column v + j - pl: those within the row */                       \
          Py_ssize_t lo = pl - j > 0 ? pl - j : 0, hi = wd + pl - j < ow ? wd + pl - j : ow;                \
          for (Py_ssize_t r = 0; r < hv; r++) {                                                             \
            Py_ssize_t ir = r - pt;                                                                         \
            if (ir < 0 || ir >= h || lo >= hi) continue; /* the padding: zeros from the start */           \
            T *RESTRICT d = s + cc * block + (j * hv + r) * ow;                                             \
            const T *RESTRICT src = xp + ir * wd + j - pl;                                                  \
            for (Py_ssize_t v = lo; v < hi; v++) d[v] = src[v];                                             \
          }                                                                                                 \
        }                                                                                                   \
      }                                                                                                     \
      for (Py_ssize_t mo = 0; mo < m;) {                                                                    \
        Py_ssize_t cur = m - mo >= mb ? mb : m - mo >= 4 ? 4 : 1;                                                             \
        const T *RESTRICT pk = pks + mo * c * live; /* this block's weights, packed once per call */        \
        const T *bo = b ? b + mo : NULL;                                                                    \
        if (nv == 4)                                                                                        \
          { if (cur == mb) B4W(s, pk, bo, acc, tap, live, c, block, plane, pitch); else if (cur == 4) B4Q(s, pk, bo, acc, tap, live, c, block, plane, pitch); else B4N(s, pk, bo, acc, tap, live, c, block, plane, pitch); }                       \
        else if (nv == 2)                                                                                   \
          { if (cur == mb) B2W(s, pk, bo, acc, tap, live, c, block, plane, pitch); else if (cur == 4) B2Q(s, pk, bo, acc, tap, live, c, block, plane, pitch); else B2N(s, pk, bo, acc, tap, live, c, block, plane, pitch); }                       \
        else                                                                                                \
          { if (cur == mb) B1W(s, pk, bo, acc, tap, live, c, block, plane, pitch); else if (cur == 4) B1Q(s, pk, bo, acc, tap, live, c, block, plane, pitch); else B1N(s, pk, bo, acc, tap, live, c, block, plane, pitch); }                       \
        for (Py_ssize_t o = 0; o < cur; o++)                                                                \
          DC_STORE(T, y + (img * m + mo + o) * plane, acc + o * pitch, plane, act, p0, p1);                 \
        mo += cur;                                                                                          \
      }                                                                                                     \
    }                                                                                                       \
  }
SHIFTED_CONV(shifted_conv_float, float, sc_float_4x6, sc_float_4x4, sc_float_4x1, sc_float_2x12, sc_float_2x4,
             sc_float_2x1, sc_float_1x24, sc_float_1x4, sc_float_1x1)
SHIFTED_CONV(shifted_conv_double, double, sc_double_4x6, sc_double_4x4, sc_double_4x1, sc_double_2x12,
             sc_double_2x4, sc_double_2x1, sc_double_1x24, sc_double_1x4, sc_double_1x1)

/* shifted_conv(x, w, b, y, pads[, act, p0, p1]): direct_conv's arguments for an ungrouped
 * convolution at unit strides and dilations: x [N, C, H, W], w [M, C, KH, KW], b [M] or None, y
 * [N, M, OH, OW] written; all float32 or all float64, C-contiguous; pads (top, left) at least 0 and
 * below the kernel's size, the bottom and right ones implied by y's size. */
static PyObject *shifted_conv(PyObject *module, PyObject *args) {
  PyObject *o_x, *o_w, *o_b, *o_y;
  Py_ssize_t pt, pl;
  (void)module;
  int act = DC_NONE;
  double p0 = 0, p1 = 0;
  if (!PyArg_ParseTuple(args, "OOOO(nn)|idd", &o_x, &o_w, &o_b, &o_y, &pt, &pl, &act, &p0, &p1)) return NULL;
  if (!conv_act_ok(act, "shifted_conv")) return NULL;
  Py_buffer bx, bw, bb, by;
  int held = 0;
  PyObject *result = NULL;
  void *scratch = NULL;
  Py_ssize_t *tap = NULL;
  Py_ssize_t size = get_float_input(o_x, &bx, 4,
                                    "shifted_conv: x must be [N, C, H, W] float32 or float64, C-contiguous");
  if (!size) return NULL;
  held = 1;
  Py_ssize_t n = bx.shape[0], c = bx.shape[1], h = bx.shape[2], wd = bx.shape[3];
  const char *fmt = size == 4 ? "f" : "d";
  if (get_buffer(o_w, &bw, "w", size, fmt, -1, 0) < 0) goto done;
  held = 2;
  if (get_buffer(o_y, &by, "y", size, fmt, -1, 1) < 0) goto done;
  held = 3;
  if (bw.ndim != 4 || by.ndim != 4) {
    PyErr_SetString(PyExc_ValueError, "shifted_conv: w and y must be 4-D");
    goto done;
  }
  Py_ssize_t m = bw.shape[0];
  if (o_b != Py_None) {
    if (get_buffer(o_b, &bb, "b", size, fmt, m, 0) < 0) goto done;
    held = 4;
  }
  Py_ssize_t kh = bw.shape[2], kw = bw.shape[3], oh = by.shape[2], ow = by.shape[3];
  if (bw.shape[1] != c || by.shape[0] != n || by.shape[1] != m || pt < 0 || pl < 0) {
    PyErr_SetString(PyExc_ValueError, "shifted_conv: w must be [M, C, KH, KW] and y [N, M, OH, OW] of x's N; pads "
                    "(top, left) at least 0");
    goto done;
  }
  /* the kw shifted copies of each channel (oh + kh - 1 rows of ow), a slack for the last tile's
   * reads past the plane; the accumulators of 24 channels (the most a block sums), their weights */
  Py_ssize_t hv = oh + kh - 1, layout = c * kw * hv * ow + 4 * SC_LANES(double) * 2;
  Py_ssize_t pitch = (oh * ow + 4 * SC_LANES(float) - 1) / (4 * SC_LANES(float)) * (4 * SC_LANES(float));
  Py_ssize_t planes = 24 * pitch;
  scratch = PyMem_Malloc((size_t)(layout + planes + m * c * kh * kw) * (size_t)size);
  tap = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(2 * kh * kw + 1));
  if (!scratch || !tap) {
    PyErr_NoMemory();
    goto done;
  }
  memset(scratch, 0, (size_t)layout * (size_t)size); /* the padding and the slack (see direct_conv) */
  /* live taps as direct_conv's at unit strides: some output's row and column within the input */
  Py_ssize_t live = 0, *wix = tap + kh * kw;
  for (Py_ssize_t i = 0; i < kh; i++)
    for (Py_ssize_t j = 0; j < kw; j++) {
      if (i - pt + oh - 1 < 0 || i - pt >= h || j - pl + ow - 1 < 0 || j - pl >= wd) continue;
      tap[live] = (j * hv + i) * ow;
      wix[live++] = i * kw + j;
    }
  PyThreadState *ts = n * m * oh * ow * c * kh * kw > 65536 ? PyEval_SaveThread() : NULL;
  if (size == 4)
    shifted_conv_float(bx.buf, bw.buf, held >= 4 ? bb.buf : NULL, by.buf, scratch, (float *)scratch + layout,
                       (float *)scratch + layout + planes, tap, wix, live, n, c, m, h, wd, kh, kw, oh, ow, pt, pl,
                       pitch, act, (float)p0, (float)p1);
  else
    shifted_conv_double(bx.buf, bw.buf, held >= 4 ? bb.buf : NULL, by.buf, scratch, (double *)scratch + layout,
                        (double *)scratch + layout + planes, tap, wix, live, n, c, m, h, wd, kh, kw, oh, ow, pt,
                        pl, pitch, act, p0, p1);
  if (ts) PyEval_RestoreThread(ts);
  Py_INCREF(Py_None);
  result = Py_None;
done:
  PyMem_Free(tap);
  PyMem_Free(scratch);
  if (held >= 4) PyBuffer_Release(&bb);
  if (held >= 3) PyBuffer_Release(&by);
  if (held >= 2) PyBuffer_Release(&bw);
  if (held >= 1) PyBuffer_Release(&bx);
  return result;
}

/* depthwise_channels: a depthwise convolution vectorised across channels (fused_conv.py's
 * depthwise_native_channels), for small planes, where direct_conv's whole tile of sums per channel
 * (DW_TILE outputs for a 2x2 plane's 8 layout cells) and per-channel layout are most of its work.
 * Per image, the input is laid out channel-last with its padding as zeros, hp rows of wp cells of
 * cp channels (C rounded up to DWC_LANE), the weights tap-major (wt[t cp + c]); each output sums,
 * for DWC_WIDE (then DWC_LANE) channels at a time in registers, the bias and then its live taps in
 * row-major order: the same products in the same order as direct_conv (a padding cell adds its
 * weight times zero there too), so the two agree bit for bit under the same contraction. As
 * onnxruntime's MLAS runs depthwise convolutions over NHWC channel vectors (its ConvDepthwise
 * kernels, onnxruntime/core/mlas/lib/convdepthwise.cpp). The sums go to acc [P][cp], then each
 * channel's row of outputs to y through the activation (DC_STORE). */
#define DWC_LANE(T) ((Py_ssize_t)(64 / sizeof(T)))  /* one AVX-512 vector */
#define DWC_WIDE(T) ((Py_ssize_t)(512 / sizeof(T))) /* eight: as many independent sums as two FMA units hide */
#define DWC_POINTS 8                                /* outputs summed together past the wide blocks: likewise */
#define DEPTHWISE_CHANNELS(NAME, T)                                                                         \
  static CONV_CLONES void NAME(const T *RESTRICT x, const T *RESTRICT w, const T *RESTRICT b,              \
                                 T *RESTRICT y, T *RESTRICT s, T *RESTRICT wt, T *RESTRICT acc,             \
                                 T *RESTRICT row, const Py_ssize_t *tap, Py_ssize_t live,                   \
                                 const Py_ssize_t *wix, Py_ssize_t n, Py_ssize_t c, Py_ssize_t cp,          \
                                 Py_ssize_t h, Py_ssize_t wd, Py_ssize_t taps, Py_ssize_t oh,               \
                                 Py_ssize_t ow, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t pt, Py_ssize_t pl, \
                                 Py_ssize_t hp, Py_ssize_t wp, int act, T p0, T p1) {                       \
    (void)hp;                                                                                               \
    for (Py_ssize_t t = 0; t < live; t++)                                                                   \
      for (Py_ssize_t ch = 0; ch < c; ch++) wt[t * cp + ch] = w[ch * taps + wix[t]];                        \
    T bz[DWC_WIDE(T)];                                                                                      \
    for (Py_ssize_t img = 0; img < n; img++) {                                                              \
      const T *RESTRICT xi = x + img * c * h * wd;                                                          \
      /* the input cells over the padding's zeros (those stay zero from call to call) */                   \
      for (Py_ssize_t ch = 0; ch < c; ch++)                                                                 \
        for (Py_ssize_t r = 0; r < h; r++)                                                                  \
          for (Py_ssize_t q = 0; q < wd; q++) s[((r + pt) * wp + q + pl) * cp + ch] = xi[(ch * h + r) * wd + q]; \
      Py_ssize_t c0 = 0;                                                                                    \
      for (; c0 + DWC_WIDE(T) <= cp; c0 += DWC_WIDE(T)) {                                                   \
        for (Py_ssize_t k = 0; k < DWC_WIDE(T); k++) bz[k] = b && c0 + k < c ? b[c0 + k] : (T)0;            \
        for (Py_ssize_t oy = 0; oy < oh; oy++)                                                              \
          for (Py_ssize_t ox = 0; ox < ow; ox++) {                                                          \
            T a[DWC_WIDE(T)];                                                                               \
            for (Py_ssize_t k = 0; k < DWC_WIDE(T); k++) a[k] = bz[k];                                      \
            const T *RESTRICT base = s + (oy * sh * wp + ox * sw) * cp + c0;                                \
            for (Py_ssize_t t = 0; t < live; t++) {                                                         \
              const T *RESTRICT src = base + tap[t] * cp, *RESTRICT wv = wt + t * cp + c0;                  \
              for (Py_ssize_t k = 0; k < DWC_WIDE(T); k++) a[k] += wv[k] * src[k];                          \
            }                                                                                               \
            T *RESTRICT d = acc + (oy * ow + ox) * cp + c0;                                                 \
            for (Py_ssize_t k = 0; k < DWC_WIDE(T); k++) d[k] = a[k];                                       \
          }                                                                                                 \
      }                                                                                                     \
      /* the channels past the wide blocks, one vector of them at a time, DWC_POINTS outputs together */ \
      /* (one output's single chain of sums would wait on each multiply-add), then one at a time */     \
      Py_ssize_t plane = oh * ow;                                                                           \
      for (; c0 < cp; c0 += DWC_LANE(T)) {                                                                  \
        for (Py_ssize_t k = 0; k < DWC_LANE(T); k++) bz[k] = b && c0 + k < c ? b[c0 + k] : (T)0;            \
        Py_ssize_t p = 0;                                                                                   \
        for (; p + DWC_POINTS <= plane; p += DWC_POINTS) {                                                  \
          T a[DWC_POINTS][DWC_LANE(T)];                                                                     \
          const T *base[DWC_POINTS];                                                                        \
          for (int q = 0; q < DWC_POINTS; q++) {                                                            \
            Py_ssize_t oy = (p + q) / ow, ox = (p + q) % ow;                                                \
            base[q] = s + (oy * sh * wp + ox * sw) * cp + c0;                                               \
            for (Py_ssize_t k = 0; k < DWC_LANE(T); k++) a[q][k] = bz[k];                                   \
          }                                                                                                 \
          for (Py_ssize_t t = 0; t < live; t++) {                                                           \
            const T *RESTRICT wv = wt + t * cp + c0;                                                        \
            Py_ssize_t off = tap[t] * cp;                                                                   \
            for (int q = 0; q < DWC_POINTS; q++)                                                            \
              for (Py_ssize_t k = 0; k < DWC_LANE(T); k++) a[q][k] += wv[k] * base[q][off + k];             \
          }                                                                                                 \
          for (int q = 0; q < DWC_POINTS; q++)                                                              \
            for (Py_ssize_t k = 0; k < DWC_LANE(T); k++) acc[(p + q) * cp + c0 + k] = a[q][k];              \
        }                                                                                                   \
        for (; p < plane; p++) {                                                                            \
          T a[DWC_LANE(T)];                                                                                 \
          for (Py_ssize_t k = 0; k < DWC_LANE(T); k++) a[k] = bz[k];                                        \
          const T *RESTRICT base = s + ((p / ow) * sh * wp + (p % ow) * sw) * cp + c0;                      \
          for (Py_ssize_t t = 0; t < live; t++) {                                                           \
            const T *RESTRICT src = base + tap[t] * cp, *RESTRICT wv = wt + t * cp + c0;                    \
            for (Py_ssize_t k = 0; k < DWC_LANE(T); k++) a[k] += wv[k] * src[k];                            \
          }                                                                                                 \
          for (Py_ssize_t k = 0; k < DWC_LANE(T); k++) acc[p * cp + c0 + k] = a[k];                         \
        }                                                                                                   \
      }                                                                                                     \
      for (Py_ssize_t ch = 0; ch < c; ch++) {                                                               \
        for (Py_ssize_t p = 0; p < plane; p++) row[p] = acc[p * cp + ch];                                   \
        DC_STORE(T, y + (img * c + ch) * plane, row, plane, act, p0, p1);                                   \
      }                                                                                                     \
    }                                                                                                       \
  }
DEPTHWISE_CHANNELS(depthwise_channels_float, float)
DEPTHWISE_CHANNELS(depthwise_channels_double, double)

/* depthwise_channels(x, w, b, y, strides, pads, dilations[, act, p0, p1]): x [N, C, H, W], w [C, 1,
 * KH, KW], b [C] or None, y [N, C, OH, OW] written; all float32 or all float64, C-contiguous;
 * strides and dilations at least 1, pads (top, left) at least 0, the bottom and right ones implied
 * by y's size; act as direct_conv's. Meant for small planes: its scratch holds the padded plane of
 * every channel and the sums of every output. */
static PyObject *depthwise_channels(PyObject *module, PyObject *args) {
  PyObject *o_x, *o_w, *o_b, *o_y;
  Py_ssize_t sh, sw, pt, pl, dh, dw;
  (void)module;
  int act = DC_NONE;
  double p0 = 0, p1 = 0;
  if (!PyArg_ParseTuple(args, "OOOO(nn)(nn)(nn)|idd", &o_x, &o_w, &o_b, &o_y, &sh, &sw, &pt, &pl, &dh, &dw, &act,
                        &p0, &p1))
    return NULL;
  if (!conv_act_ok(act, "depthwise_channels")) return NULL;
  Py_buffer bx, bw, bb, by;
  int held = 0;
  PyObject *result = NULL;
  void *scratch = NULL;
  Py_ssize_t *tap = NULL;
  Py_ssize_t size = get_float_input(o_x, &bx, 4,
                                    "depthwise_channels: x must be [N, C, H, W] float32 or float64, C-contiguous");
  if (!size) return NULL;
  held = 1;
  Py_ssize_t n = bx.shape[0], c = bx.shape[1], h = bx.shape[2], wd = bx.shape[3];
  const char *fmt = size == 4 ? "f" : "d";
  if (get_buffer(o_w, &bw, "w", size, fmt, -1, 0) < 0) goto done;
  held = 2;
  if (get_buffer(o_y, &by, "y", size, fmt, -1, 1) < 0) goto done;
  held = 3;
  if (o_b != Py_None) {
    if (get_buffer(o_b, &bb, "b", size, fmt, c, 0) < 0) goto done;
    held = 4;
  }
  if (bw.ndim != 4 || by.ndim != 4 || bw.shape[0] != c || bw.shape[1] != 1 || by.shape[0] != n || by.shape[1] != c ||
      sh < 1 || sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0) {
    PyErr_SetString(PyExc_ValueError, "depthwise_channels: w must be [C, 1, KH, KW] and y [N, C, OH, OW] of x's N "
                    "and C; strides and dilations at least 1, pads at least 0");
    goto done;
  }
  Py_ssize_t kh = bw.shape[2], kw = bw.shape[3], oh = by.shape[2], ow = by.shape[3];
  Py_ssize_t lane = 64 / size, cp = (c + lane - 1) / lane * lane;
  /* the padded plane: the input's and every tap's reach, rows and columns */
  Py_ssize_t hp = (oh - 1) * sh + (kh - 1) * dh + 1, wp = (ow - 1) * sw + (kw - 1) * dw + 1;
  if (hp < h + pt) hp = h + pt;
  if (wp < wd + pl) wp = wd + pl;
  Py_ssize_t cells = hp * wp * cp, weights = kh * kw * cp, sums = oh * ow * cp;
  scratch = PyMem_Malloc((size_t)(cells + weights + sums + oh * ow) * (size_t)size);
  tap = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(2 * kh * kw + 1));
  if (!scratch || !tap) {
    PyErr_NoMemory();
    goto done;
  }
  /* zeros: the padding, and the channels past C (their weights too, so no NaN reaches a sum) */
  memset(scratch, 0, (size_t)(cells + weights) * (size_t)size);
  /* the live taps, as direct_conv's (those reading only padding for every output are left out);
   * tap[t]: the cell offset of tap t from an output's window corner */
  Py_ssize_t live = 0, *wix = tap + kh * kw;
  for (Py_ssize_t i = 0; i < kh; i++)
    for (Py_ssize_t j = 0; j < kw; j++) {
      Py_ssize_t r0 = i * dh - pt, c0 = j * dw - pl;
      int rows = r0 + (oh - 1) * sh >= 0 && r0 < h && (r0 >= 0 || (-r0 + sh - 1) / sh * sh + r0 < h);
      int cols = c0 + (ow - 1) * sw >= 0 && c0 < wd && (c0 >= 0 || (-c0 + sw - 1) / sw * sw + c0 < wd);
      if (!rows || !cols) continue;
      tap[live] = i * dh * wp + j * dw;
      wix[live++] = i * kw + j;
    }
  const void *bias = held >= 4 ? bb.buf : NULL;
  PyThreadState *ts = n * c * oh * ow * kh * kw > 65536 ? PyEval_SaveThread() : NULL;
  if (size == 4) {
    float *sc = scratch;
    depthwise_channels_float(bx.buf, bw.buf, bias, by.buf, sc, sc + cells, sc + cells + weights,
                             sc + cells + weights + sums, tap, live, wix, n, c, cp, h, wd, kh * kw, oh, ow, sh, sw,
                             pt, pl, hp, wp, act, (float)p0, (float)p1);
  } else {
    double *sc = scratch;
    depthwise_channels_double(bx.buf, bw.buf, bias, by.buf, sc, sc + cells, sc + cells + weights,
                              sc + cells + weights + sums, tap, live, wix, n, c, cp, h, wd, kh * kw, oh, ow, sh, sw,
                              pt, pl, hp, wp, act, p0, p1);
  }
  if (ts) PyEval_RestoreThread(ts);
  Py_INCREF(Py_None);
  result = Py_None;
done:
  PyMem_Free(tap);
  PyMem_Free(scratch);
  if (held >= 4) PyBuffer_Release(&bb);
  if (held >= 3) PyBuffer_Release(&by);
  if (held >= 2) PyBuffer_Release(&bw);
  if (held >= 1) PyBuffer_Release(&bx);
  return result;
}

/* depthwise_unit: a depthwise convolution at unit stride and dilation whose every tap reaches the
 * input (fused_conv.py's depthwise_native_rows; ConvNeXt's 7x7 layers). Each channel's plane is
 * laid out with its padding as zeros, hv rows of wv (as direct_conv's single phase); output row oy
 * reads layout rows oy to oy + kh - 1, so DW_ROWS output rows are summed together, DW_COLS columns
 * of each at a time, in DW_ROWS vector registers: a layout row's DW_COLS values, loaded once per
 * tap column, feed every row of the block whose kernel row reaches it. That is kw (DW_ROWS + kh - 1)
 * loads for DW_ROWS kh kw multiply-adds (FMAs in the AVX2 and AVX-512 clones, CONV_CLONES), where
 * direct_conv's flat tiles load once per multiply-add. The last block's rows and columns past the
 * outputs are summed from the layout's zeroed slack and dropped. */
#if defined(__GNUC__)
#define DW_ROWS 8
#define DW_COLS 16
typedef float dw_vf __attribute__((vector_size(DW_COLS * sizeof(float))));
typedef double dw_vd __attribute__((vector_size(DW_COLS * sizeof(double))));
typedef float dw_vf_narrow __attribute__((vector_size(DW_COLS / 2 * sizeof(float))));
typedef double dw_vd_narrow __attribute__((vector_size(DW_COLS / 2 * sizeof(double))));
/* the block's row R takes kernel row q - R, where there is one */
#define DW_ACC(R, KH)                                                                                       \
  if (q_ >= (R) && q_ - (R) < KH) a##R += wr[((q_ - (R)) * kw)] * v
/* one block's sums for a kernel of KH rows, a constant: each layout row q written out, so which
 * rows of the block it feeds is known when compiling, and each tap column's loop is only its load
 * and FMAs */
#define DW_ROW(T, V, KH, KW, q)                                                                             \
  if ((q) < DW_ROWS + (KH) - 1) {                                                                           \
    const T *RESTRICT src = s + (oy + (q)) * wv + ox;                                                       \
    for (Py_ssize_t j = 0; j < (KW); j++) {                                                                 \
      V v;                                                                                                  \
      memcpy(&v, src + j, sizeof v);                                                                        \
      const T *RESTRICT wr = wk + j;                                                                        \
      const Py_ssize_t q_ = (q);                                                                            \
      DW_ACC(0, KH);                                                                                        \
      DW_ACC(1, KH);                                                                                        \
      DW_ACC(2, KH);                                                                                        \
      DW_ACC(3, KH);                                                                                        \
      DW_ACC(4, KH);                                                                                        \
      DW_ACC(5, KH);                                                                                        \
      DW_ACC(6, KH);                                                                                        \
      DW_ACC(7, KH);                                                                                        \
    }                                                                                                       \
  }
#define DW_BLOCK(T, V, KH, KW)                                                                              \
  do {                                                                                                      \
    DW_ROW(T, V, KH, KW, 0);                                                                                \
    DW_ROW(T, V, KH, KW, 1);                                                                                \
    DW_ROW(T, V, KH, KW, 2);                                                                                \
    DW_ROW(T, V, KH, KW, 3);                                                                                \
    DW_ROW(T, V, KH, KW, 4);                                                                                \
    DW_ROW(T, V, KH, KW, 5);                                                                                \
    DW_ROW(T, V, KH, KW, 6);                                                                                \
    DW_ROW(T, V, KH, KW, 7);                                                                                \
    DW_ROW(T, V, KH, KW, 8);                                                                                \
    DW_ROW(T, V, KH, KW, 9);                                                                                \
    DW_ROW(T, V, KH, KW, 10);                                                                               \
    DW_ROW(T, V, KH, KW, 11);                                                                               \
    DW_ROW(T, V, KH, KW, 12);                                                                               \
    DW_ROW(T, V, KH, KW, 13);                                                                               \
  } while (0)
#define DEPTHWISE_UNIT(NAME, T, V, COLS)                                                                    \
  static CONV_CLONES void NAME(const T *RESTRICT x, const T *RESTRICT w, const T *RESTRICT b,               \
                                 T *RESTRICT y, T *RESTRICT s, Py_ssize_t n, Py_ssize_t c, Py_ssize_t h,    \
                                 Py_ssize_t wd, Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t oh, Py_ssize_t ow, \
                                 Py_ssize_t pt, Py_ssize_t pl, Py_ssize_t wv, int act, T p0, T p1) {        \
    /* the layout's columns v holding input column v - pl */                                                \
    Py_ssize_t lo = pl, hi = wd + pl < wv ? wd + pl : wv;                                                   \
    for (Py_ssize_t img = 0; img < n; img++)                                                                \
      for (Py_ssize_t ch = 0; ch < c; ch++) {                                                               \
        const T *RESTRICT xp = x + (img * c + ch) * h * wd;                                                 \
        for (Py_ssize_t r = 0; r < h; r++) {                                                                \
          /* every input row lies in the layout (pads at least 0); the padding stays the zeros */           \
          T *RESTRICT d = s + (r + pt) * wv;                                                                \
          const T *RESTRICT src = xp + r * wd - pl;                                                         \
          for (Py_ssize_t v = lo; v < hi; v++) d[v] = src[v];                                               \
        }                                                                                                   \
        const T *RESTRICT wk = w + ch * kh * kw;                                                            \
        T bias = b ? b[ch] : (T)0;                                                                          \
        T *RESTRICT yp = y + (img * c + ch) * oh * ow;                                                      \
        for (Py_ssize_t oy = 0; oy < oh; oy += DW_ROWS)                                                     \
          for (Py_ssize_t ox = 0; ox < ow; ox += (COLS)) {                                                  \
            V a0, a1, a2, a3, a4, a5, a6, a7;                                                               \
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = (V){0} + bias;                                          \
            /* square kernels with their width a constant too: each tap column's loop unrolled */           \
            switch (kh * 8 + (kw == kh ? 0 : 1)) {                                                          \
            case 24:                                                                                        \
              DW_BLOCK(T, V, 3, 3);                                                                         \
              break;                                                                                        \
            case 40:                                                                                        \
              DW_BLOCK(T, V, 5, 5);                                                                         \
              break;                                                                                        \
            case 56:                                                                                        \
              DW_BLOCK(T, V, 7, 7);                                                                         \
              break;                                                                                        \
            case 25:                                                                                        \
              DW_BLOCK(T, V, 3, kw);                                                                        \
              break;                                                                                        \
            case 41:                                                                                        \
              DW_BLOCK(T, V, 5, kw);                                                                        \
              break;                                                                                        \
            default:                                                                                        \
              DW_BLOCK(T, V, 7, kw);                                                                        \
            }                                                                                               \
            T out[DW_ROWS][COLS];                                                                           \
            memcpy(out[0], &a0, sizeof a0);                                                                 \
            memcpy(out[1], &a1, sizeof a1);                                                                 \
            memcpy(out[2], &a2, sizeof a2);                                                                 \
            memcpy(out[3], &a3, sizeof a3);                                                                 \
            memcpy(out[4], &a4, sizeof a4);                                                                 \
            memcpy(out[5], &a5, sizeof a5);                                                                 \
            memcpy(out[6], &a6, sizeof a6);                                                                 \
            memcpy(out[7], &a7, sizeof a7);                                                                 \
            Py_ssize_t rows = oh - oy < DW_ROWS ? oh - oy : DW_ROWS;                                        \
            Py_ssize_t cols = ow - ox < (COLS) ? ow - ox : (COLS);                                          \
            for (Py_ssize_t r = 0; r < rows; r++)                                                           \
              DC_STORE(T, yp + (oy + r) * ow + ox, out[r], cols, act, p0, p1);                              \
          }                                                                                                 \
      }                                                                                                     \
  }
DEPTHWISE_UNIT(depthwise_unit_float, float, dw_vf, DW_COLS)
DEPTHWISE_UNIT(depthwise_unit_double, double, dw_vd, DW_COLS)
/* half as many columns, for outputs at most that wide (ConvNeXt's last stage, 7 wide): the wide
 * block's columns past them would be computed and dropped */
DEPTHWISE_UNIT(depthwise_unit_float_narrow, float, dw_vf_narrow, DW_COLS / 2)
DEPTHWISE_UNIT(depthwise_unit_double_narrow, double, dw_vd_narrow, DW_COLS / 2)

/* depthwise_unit(x, w, b, y, pads[, act, p0, p1]): x [N, C, H, W], w [C, 1, KH, KW] (KH 3, 5 or 7), b [C] or None,
 * y [N, C, OH, OW] written, all float32 or all float64, C-contiguous; unit strides and dilations;
 * pads (top, left) at least 0, the bottom and right ones implied by y's size, such that every tap
 * reaches the input for some output (KH - top <= H and OH > top, and likewise for the columns);
 * act as direct_conv's. */
static PyObject *depthwise_unit(PyObject *module, PyObject *args) {
  PyObject *o_x, *o_w, *o_b, *o_y;
  Py_ssize_t pt, pl;
  (void)module;
  int act = DC_NONE;
  double p0 = 0, p1 = 0;
  if (!PyArg_ParseTuple(args, "OOOO(nn)|idd", &o_x, &o_w, &o_b, &o_y, &pt, &pl, &act, &p0, &p1)) return NULL;
  if (!conv_act_ok(act, "depthwise_unit")) return NULL;
  Py_buffer bx, bw, bb, by;
  int held = 0;
  PyObject *result = NULL;
  void *scratch = NULL;
  Py_ssize_t size = get_float_input(o_x, &bx, 4,
                                    "depthwise_unit: x must be [N, C, H, W] float32 or float64, C-contiguous");
  if (!size) return NULL;
  held = 1;
  Py_ssize_t n = bx.shape[0], c = bx.shape[1], h = bx.shape[2], wd = bx.shape[3];
  const char *fmt = size == 4 ? "f" : "d";
  if (get_buffer(o_w, &bw, "w", size, fmt, -1, 0) < 0) goto done;
  held = 2;
  if (get_buffer(o_y, &by, "y", size, fmt, -1, 1) < 0) goto done;
  held = 3;
  if (o_b != Py_None) {
    if (get_buffer(o_b, &bb, "b", size, fmt, c, 0) < 0) goto done;
    held = 4;
  }
  if (bw.ndim != 4 || by.ndim != 4 || bw.shape[0] != c || bw.shape[1] != 1 || by.shape[0] != n ||
      by.shape[1] != c || pt < 0 || pl < 0) {
    PyErr_SetString(PyExc_ValueError, "depthwise_unit: w must be [C, 1, KH, KW] and y [N, C, OH, OW] of x's N and C; "
                    "pads at least 0");
    goto done;
  }
  Py_ssize_t kh = bw.shape[2], kw = bw.shape[3], oh = by.shape[2], ow = by.shape[3];
  /* the layout's rows and columns: the outputs' plus the kernel's reach; the bottom and right
   * padding is what y's size implies, and must not cut the input */
  Py_ssize_t hv = oh + kh - 1, wv = ow + kw - 1;
  if (kh != 3 && kh != 5 && kh != 7) {
    PyErr_SetString(PyExc_ValueError, "depthwise_unit: the kernel must have 3, 5 or 7 rows");
    goto done;
  }
  if (kw < 1 || oh < 1 || ow < 1 || h + pt > hv || wd + pl > wv || kh - pt > h || oh <= pt ||
      kw - pl > wd || ow <= pl) {
    PyErr_SetString(PyExc_ValueError, "depthwise_unit: the padding must leave every tap reading the input for some "
                    "output and every input value inside the padded plane");
    goto done;
  }
  /* the rows of the last block past the outputs, and its last tile's columns, read the slack */
  Py_ssize_t rows = (oh + DW_ROWS - 1) / DW_ROWS * DW_ROWS + kh - 1;
  Py_ssize_t cells = rows * wv + DW_COLS;
  scratch = PyMem_Malloc((size_t)cells * (size_t)size);
  if (!scratch) {
    PyErr_NoMemory();
    goto done;
  }
  memset(scratch, 0, (size_t)cells * (size_t)size);
  const void *bias = held >= 4 ? bb.buf : NULL;
  PyThreadState *ts = n * c * oh * ow * kh * kw > 65536 ? PyEval_SaveThread() : NULL;
  if (size == 4)
    (ow <= DW_COLS / 2 ? depthwise_unit_float_narrow : depthwise_unit_float)(
        bx.buf, bw.buf, bias, by.buf, scratch, n, c, h, wd, kh, kw, oh, ow, pt, pl, wv, act, (float)p0, (float)p1);
  else
    (ow <= DW_COLS / 2 ? depthwise_unit_double_narrow : depthwise_unit_double)(
        bx.buf, bw.buf, bias, by.buf, scratch, n, c, h, wd, kh, kw, oh, ow, pt, pl, wv, act, p0, p1);
  if (ts) PyEval_RestoreThread(ts);
  Py_INCREF(Py_None);
  result = Py_None;
done:
  PyMem_Free(scratch);
  if (held >= 4) PyBuffer_Release(&bb);
  if (held >= 3) PyBuffer_Release(&by);
  if (held >= 2) PyBuffer_Release(&bw);
  if (held >= 1) PyBuffer_Release(&bx);
  return result;
}
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
/* A float32 product Y = W X (+ b) for the convolutions' products with few columns (1x1 and im2col
 * layers over 7x7 planes), where OpenBLAS's sgemm repacks the whole weight matrix on every call and
 * its kernels, tiled for wide products, run at about three quarters of their speed. W is packed
 * once per layer by its caller (fused_conv.FusedConv._packed_weights): [ceil(M / PG_MR)][K][PG_MR],
 * zero rows past M, so a block of PG_MR output channels is PG_MV AVX-512 vectors per k; the
 * columns of X are packed per image in blocks of PG_NR, zero past P. Each block of PG_MR x PG_NR
 * outputs is summed over k in 28 vector registers, one FMA per channel vector and column, PG_KC
 * values of k at a time, each pass's sums added to a tile per column block (blocked summation, as
 * BLAS's passes over k: the rounding grows with PG_KC and K / PG_KC, not K), the packed weights
 * reused across PG_CHUNK column blocks (MLAS packs its GEMM's B once per convolution and sums a
 * register tile per block the same way: onnxruntime/core/mlas/lib/sgemm.cpp,
 * x86_64/SgemmKernelAvx512F.S). Rounded once per FMA. Built for AVX-512 only:
 * its callers check packed_gemm_supported(). */
#define PG_MR 64 /* output channels a block: 4 AVX-512 vectors */
#define PG_NR 7  /* columns a block: 7x7, 14x14 and 28x28 planes are whole blocks */
#define PG_KC 128 /* k a pass: a block of weights (32 KB) stays in L1 across the column blocks */
#define PG_CHUNK 16 /* column blocks a pass over the weights: their columns packed (L2), their tiles (L1) */
#define PG_MV (PG_MR / 16)
typedef float pg_v16 __attribute__((vector_size(64), aligned(4)));
__attribute__((target("arch=x86-64-v4"), optimize("fp-contract=fast", "no-trapping-math"))) static void
packed_gemm_float(const float *RESTRICT wp, const float *RESTRICT x, const float *RESTRICT b, float *RESTRICT y,
                  float *RESTRICT xp, float *RESTRICT ct, Py_ssize_t n, Py_ssize_t m, Py_ssize_t k, Py_ssize_t p,
                  Py_ssize_t mb0, Py_ssize_t mb1) {
  Py_ssize_t pblocks = (p + PG_NR - 1) / PG_NR;
  for (Py_ssize_t img = 0; img < n; img++) {
    const float *xi = x + img * k * p;
    float *yi = y + img * m * p;
    for (Py_ssize_t c0 = 0; c0 < pblocks; c0 += PG_CHUNK) {
      Py_ssize_t c1 = pblocks - c0 < PG_CHUNK ? pblocks : c0 + PG_CHUNK;
      for (Py_ssize_t pb = c0; pb < c1; pb++) {
        Py_ssize_t p0 = pb * PG_NR, cols = p - p0 < PG_NR ? p - p0 : PG_NR;
        float *dst = xp + (pb - c0) * k * PG_NR;
        for (Py_ssize_t kk = 0; kk < k; kk++) {
          const float *src = xi + kk * p + p0;
          for (Py_ssize_t j = 0; j < PG_NR; j++) dst[kk * PG_NR + j] = j < cols ? src[j] : 0.0f;
        }
      }
      for (Py_ssize_t mb = mb0; mb < mb1; mb++) {
        const float *wb = wp + mb * k * PG_MR;
        for (Py_ssize_t k0 = 0; k0 < k; k0 += PG_KC) {
          Py_ssize_t k1 = k - k0 < PG_KC ? k : k0 + PG_KC;
          for (Py_ssize_t pb = c0; pb < c1; pb++) {
            const float *xb = xp + (pb - c0) * k * PG_NR;
            float *cb = ct + (pb - c0) * PG_NR * PG_MR;
            pg_v16 a[PG_NR][PG_MV];
#pragma GCC unroll 16
            for (int j = 0; j < PG_NR; j++)
#pragma GCC unroll 4
              for (int v = 0; v < PG_MV; v++) a[j][v] = (pg_v16){0};
            for (Py_ssize_t kk = k0; kk < k1; kk++) {
              pg_v16 wv[PG_MV];
#pragma GCC unroll 4
              for (int v = 0; v < PG_MV; v++) wv[v] = *(const pg_v16 *)(wb + kk * PG_MR + v * 16);
              const float *xk = xb + kk * PG_NR;
#pragma GCC unroll 16
              for (int j = 0; j < PG_NR; j++)
#pragma GCC unroll 4
                for (int v = 0; v < PG_MV; v++) a[j][v] += wv[v] * xk[j];
            }
#pragma GCC unroll 16
            for (int j = 0; j < PG_NR; j++)
#pragma GCC unroll 4
              for (int v = 0; v < PG_MV; v++) {
                pg_v16 *t = (pg_v16 *)(cb + j * PG_MR + v * 16);
                *t = k0 ? *t + a[j][v] : a[j][v];
              }
          }
        }
        Py_ssize_t rows = m - mb * PG_MR < PG_MR ? m - mb * PG_MR : PG_MR;
        Py_ssize_t q0 = c0 * PG_NR, q1 = c1 * PG_NR < p ? c1 * PG_NR : p;
        for (Py_ssize_t r = 0; r < rows; r++) {
          float bias = b ? b[mb * PG_MR + r] : 0.0f, *yr = yi + (mb * PG_MR + r) * p;
          for (Py_ssize_t q = q0; q < q1; q++)
            yr[q] = ct[(q / PG_NR - c0) * PG_NR * PG_MR + (q % PG_NR) * PG_MR + r] + bias;
        }
      }
    }
  }
}

static PyObject *packed_gemm_supported(PyObject *module, PyObject *args) {
  (void)module;
  (void)args;
  __builtin_cpu_init();
  return PyBool_FromLong(__builtin_cpu_supports("avx512f"));
}

/* packed_gemm(wp, x, b, y, blocks): y[i] = W x[i] (+ b) for the output channels of the blocks
 * mb in range(*blocks) (PG_MR channels each); wp float32 [ceil(M / PG_MR), K, PG_MR], x [N, K, P],
 * b [M] or None, y [N, M, P], float32, C-contiguous. */
static PyObject *packed_gemm(PyObject *module, PyObject *args) {
  PyObject *o_w, *o_x, *o_b, *o_y;
  Py_ssize_t mb0, mb1;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOOO(nn)", &o_w, &o_x, &o_b, &o_y, &mb0, &mb1)) return NULL;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) {
    PyErr_SetString(PyExc_RuntimeError, "packed_gemm: this CPU has no AVX-512 (see packed_gemm_supported())");
    return NULL;
  }
  Py_buffer bw, bx, bb, by;
  int held = 0;
  PyObject *result = NULL;
  float *xp = NULL;
  if (get_buffer(o_x, &bx, "x", 4, "f", -1, 0) < 0) return NULL;
  held = 1;
  if (get_buffer(o_y, &by, "y", 4, "f", -1, 1) < 0) goto done;
  held = 2;
  if (bx.ndim != 3 || by.ndim != 3 || by.shape[0] != bx.shape[0] || by.shape[2] != bx.shape[2]) {
    PyErr_SetString(PyExc_ValueError, "packed_gemm: x must be [N, K, P] and y [N, M, P]");
    goto done;
  }
  Py_ssize_t n = bx.shape[0], k = bx.shape[1], p = bx.shape[2], m = by.shape[1];
  Py_ssize_t blocks = (m + PG_MR - 1) / PG_MR;
  if (get_buffer(o_w, &bw, "wp", 4, "f", blocks * k * PG_MR, 0) < 0) goto done;
  held = 3;
  if (o_b != Py_None) {
    if (get_buffer(o_b, &bb, "b", 4, "f", m, 0) < 0) goto done;
    held = 4;
  }
  if (mb0 < 0 || mb1 > blocks || mb0 > mb1 || k < 1 || p < 1) {
    PyErr_SetString(PyExc_ValueError, "packed_gemm: blocks must lie within range(ceil(M / PACKED_GEMM_BLOCK)); K and P at least 1");
    goto done;
  }
  Py_ssize_t padded = (p + PG_NR - 1) / PG_NR * PG_NR;
  if (padded > PG_CHUNK * PG_NR) padded = PG_CHUNK * PG_NR;
  xp = PyMem_Malloc((size_t)(padded * k + padded * PG_MR) * sizeof(float));
  if (!xp) {
    PyErr_NoMemory();
    goto done;
  }
  Py_BEGIN_ALLOW_THREADS
  packed_gemm_float(bw.buf, bx.buf, held >= 4 ? bb.buf : NULL, by.buf, xp, xp + padded * k, n, m, k, p, mb0, mb1);
  Py_END_ALLOW_THREADS
  Py_INCREF(Py_None);
  result = Py_None;
done:
  PyMem_Free(xp);
  if (held >= 4) PyBuffer_Release(&bb);
  if (held >= 3) PyBuffer_Release(&bw);
  if (held >= 2) PyBuffer_Release(&by);
  if (held >= 1) PyBuffer_Release(&bx);
  return result;
}
#endif

/* ---- small 1x1 convolutions ---- */

/* A 1x1 convolution at unit stride without padding, for layers of few outputs (fused_conv.py's
 * pointwise_native: MobileNet's and EfficientNet's expansions, projections and squeeze-excitation
 * layers over planes of 1 to 16 positions), where numpy's product, bias, residual and activation
 * are four calls of about a microsecond each around a product of about one. y[i, m, q] =
 * act(sum_k w[m, k] x[i, k, q] + b[m] + z[i, m, q]): the weights transposed and zero-padded
 * per layer by the caller, wt [K, MP] (MP a multiple of PW_BLOCK), so a block of output channels
 * is contiguous vectors; PW_COLS output positions at a time, each column's sums over k in
 * registers (FMAs in the AVX2 and AVX-512 clones, CONV_CLONES), k in order; then the bias, the
 * residual, and a clamp as the outputs are written (DC_STORE's, in order); hard swish after, over
 * the whole output, by hard_swish_float/double (no contraction, numpy's rounding). */
#define PW_COLS 4
#define PW_BLOCK 64 /* channels of the padded weight rows' blocks: 4 AVX-512 vectors of floats */
#define PW_TAIL 16  /* the blocks past the last whole PW_BLOCK: one vector of floats */
#define PW_SUMS(T, MC, NC, m0)                                                                               \
  do {                                                                                                      \
    T s[NC][MC];                                                                                            \
    _Pragma("GCC unroll 4") for (int j = 0; j < NC; j++)                                                    \
      _Pragma("GCC unroll 64") for (int v = 0; v < MC; v++) s[j][v] = 0;                                    \
    for (Py_ssize_t kk = 0; kk < k; kk++) {                                                                 \
      const T *wr = wt + kk * mp + (m0);                                                                    \
      const T *xr = xi + kk * p + q0;                                                                       \
      T xv[NC];                                                                                             \
      _Pragma("GCC unroll 4") for (int j = 0; j < NC; j++) xv[j] = j < cols ? xr[j] : (T)0;                 \
      _Pragma("GCC unroll 4") for (int j = 0; j < NC; j++)                                                  \
        _Pragma("GCC unroll 64") for (int v = 0; v < MC; v++) s[j][v] += wr[v] * xv[j];                     \
    }                                                                                                       \
    Py_ssize_t rows = m - (m0) < (MC) ? m - (m0) : (MC);                                                    \
    for (Py_ssize_t r = 0; r < rows; r++) {                                                                 \
      Py_ssize_t at = (i * m + (m0) + r) * p + q0;                                                          \
      for (Py_ssize_t j = 0; j < cols; j++) {                                                               \
        T v = s[j][r];                                                                                      \
        if (b) v = v + b[(m0) + r];                                                                         \
        if (z) v = v + z[at + j];                                                                           \
        if (act == DC_CLAMP) {                                                                              \
          v = v < p0 ? p0 : v;                                                                              \
          v = v > p1 ? p1 : v;                                                                              \
        }                                                                                                   \
        y[at + j] = v;                                                                                      \
      }                                                                                                     \
    }                                                                                                       \
  } while (0)
/* a last single column (planes of 1x1, odd ones) sums one column, not PW_COLS of which three are zero */
#define POINTWISE_CONV(NAME, T)                                                                              \
  static CONV_CLONES void NAME(const T *RESTRICT wt, const T *RESTRICT x, const T *RESTRICT b,              \
                               const T *RESTRICT z, T *RESTRICT y, Py_ssize_t n, Py_ssize_t k, Py_ssize_t m, \
                               Py_ssize_t mp, Py_ssize_t p, int act, T p0, T p1) {                          \
    enum { MC = PW_BLOCK * 4 / (int)sizeof(T), TC = PW_TAIL * 4 / (int)sizeof(T) };                        \
    for (Py_ssize_t i = 0; i < n; i++) {                                                                    \
      const T *xi = x + i * k * p;                                                                          \
      for (Py_ssize_t q0 = 0; q0 < p; q0 += PW_COLS) {                                                      \
        Py_ssize_t cols = p - q0 < PW_COLS ? p - q0 : PW_COLS, m0 = 0;                                      \
        if (cols == 1) {                                                                                    \
          for (; m0 + MC <= m; m0 += MC) PW_SUMS(T, MC, 1, m0);                                             \
          for (; m0 < m; m0 += TC) PW_SUMS(T, TC, 1, m0);                                                   \
        } else {                                                                                            \
          for (; m0 + MC <= m; m0 += MC) PW_SUMS(T, MC, PW_COLS, m0);                                       \
          for (; m0 < m; m0 += TC) PW_SUMS(T, TC, PW_COLS, m0);                                             \
        }                                                                                                   \
      }                                                                                                     \
    }                                                                                                       \
  }
POINTWISE_CONV(pointwise_conv_float, float)
POINTWISE_CONV(pointwise_conv_double, double)

/* pointwise_conv(wt, x, b, z, y[, act, p0, p1]): a 1x1 convolution of x [N, K, P] into y [N, M, P]
 * with wt [K, MP] (w [M, K] transposed, zero columns past M, MP a multiple of PW_BLOCK at least
 * M), b [M] or None, residual z [N, M, P] or None; all float32 or all float64, C-contiguous; act
 * as direct_conv's. */
static PyObject *pointwise_conv(PyObject *module, PyObject *args) {
  PyObject *o_w, *o_x, *o_b, *o_z, *o_y;
  int act = DC_NONE;
  double p0 = 0, p1 = 0;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOOOO|idd", &o_w, &o_x, &o_b, &o_z, &o_y, &act, &p0, &p1)) return NULL;
  if (!conv_act_ok(act, "pointwise_conv")) return NULL;
  Py_buffer bx, bw, bb, bz, by;
  int held = 0, has_b = 0, has_z = 0;
  PyObject *result = NULL;
  Py_ssize_t size = get_float_input(o_x, &bx, 3,
                                    "pointwise_conv: x must be [N, K, P] float32 or float64, C-contiguous");
  if (!size) return NULL;
  held = 1;
  Py_ssize_t n = bx.shape[0], k = bx.shape[1], p = bx.shape[2];
  const char *fmt = size == 4 ? "f" : "d";
  if (get_buffer(o_w, &bw, "wt", size, fmt, -1, 0) < 0) goto done;
  held = 2;
  if (get_buffer(o_y, &by, "y", size, fmt, -1, 1) < 0) goto done;
  held = 3;
  Py_ssize_t m = by.ndim == 3 ? by.shape[1] : 0, mp = bw.ndim == 2 ? bw.shape[1] : 0;
  if (bw.ndim != 2 || by.ndim != 3 || bw.shape[0] != k || by.shape[0] != n || by.shape[2] != p || m < 1 ||
      mp < m || mp % PW_BLOCK) {
    PyErr_SetString(PyExc_ValueError, "pointwise_conv: wt must be [K, MP] (MP a multiple of POINTWISE_BLOCK, at "
                    "least M) and y [N, M, P] of x's N and P");
    goto done;
  }
  if (o_b != Py_None) {
    if (get_buffer(o_b, &bb, "b", size, fmt, m, 0) < 0) goto done;
    has_b = 1;
  }
  if (o_z != Py_None) {
    if (get_buffer(o_z, &bz, "z", size, fmt, n * m * p, 0) < 0) goto done;
    has_z = 1;
  }
  PyThreadState *ts = n * m * k * p > 65536 ? PyEval_SaveThread() : NULL;
  if (size == 4) {
    pointwise_conv_float(bw.buf, bx.buf, has_b ? bb.buf : NULL, has_z ? bz.buf : NULL, by.buf, n, k, m, mp, p, act,
                         (float)p0, (float)p1);
    if (act == DC_HARD_SWISH) hard_swish_float(by.buf, n * m * p, (float)p0, (float)p1);
  } else {
    pointwise_conv_double(bw.buf, bx.buf, has_b ? bb.buf : NULL, has_z ? bz.buf : NULL, by.buf, n, k, m, mp, p, act,
                          p0, p1);
    if (act == DC_HARD_SWISH) hard_swish_double(by.buf, n * m * p, p0, p1);
  }
  if (ts) PyEval_RestoreThread(ts);
  Py_INCREF(Py_None);
  result = Py_None;
done:
  if (has_z) PyBuffer_Release(&bz);
  if (has_b) PyBuffer_Release(&bb);
  if (held >= 3) PyBuffer_Release(&by);
  if (held >= 2) PyBuffer_Release(&bw);
  if (held >= 1) PyBuffer_Release(&bx);
  return result;
}

/* ---- small dense convolutions: im2col on the stack, then pointwise_conv's product ---- */

/* A convolution of few outputs a plane (fused_conv.py's im2col_native: ResNet's 3x3 layers over
 * 4x4 planes, strided 1x1 shortcuts), where numpy's gather (one take, one product, the epilogue)
 * is several calls of about a microsecond around a product of a few. Per image, the windows are
 * copied into a buffer on the stack, cols [C KH KW, P] (padding as zeros, taps in im2col's order),
 * and summed by pointwise_conv's kernel with the same transposed weights wt [C KH KW, MP]: each
 * block of output channels in registers, k in order, the bias, residual and clamp as the outputs
 * are written. SC_CELLS bounds the buffer (its caller's SMALL_CONV_MAX_CELLS). */
#define SC_CELLS 8192
#define SMALL_CONV_COLS(NAME, T)                                                                             \
  static void NAME(const T *RESTRICT x, T *RESTRICT cols, Py_ssize_t c, Py_ssize_t h, Py_ssize_t w,          \
                   Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t oh, Py_ssize_t ow, Py_ssize_t sh, Py_ssize_t sw,  \
                   Py_ssize_t top, Py_ssize_t left) {                                                        \
    Py_ssize_t p = oh * ow;                                                                                  \
    for (Py_ssize_t ch = 0; ch < c; ch++)                                                                    \
      for (Py_ssize_t r = 0; r < kh; r++)                                                                    \
        for (Py_ssize_t t = 0; t < kw; t++) {                                                                \
          T *row = cols + ((ch * kh + r) * kw + t) * p;                                                      \
          for (Py_ssize_t oy = 0; oy < oh; oy++) {                                                           \
            Py_ssize_t iy = oy * sh + r - top;                                                               \
            T *dst = row + oy * ow;                                                                          \
            if (iy < 0 || iy >= h) {                                                                         \
              for (Py_ssize_t ox = 0; ox < ow; ox++) dst[ox] = 0;                                            \
              continue;                                                                                      \
            }                                                                                                \
            const T *src = x + (ch * h + iy) * w;                                                            \
            for (Py_ssize_t ox = 0; ox < ow; ox++) {                                                         \
              Py_ssize_t ix = ox * sw + t - left;                                                            \
              dst[ox] = ix >= 0 && ix < w ? src[ix] : (T)0;                                                  \
            }                                                                                                \
          }                                                                                                  \
        }                                                                                                    \
  }
SMALL_CONV_COLS(small_conv_cols_float, float)
SMALL_CONV_COLS(small_conv_cols_double, double)

/* small_conv(wt, x, b, z, y, strides, pads, kernel[, act, p0, p1]): an ungrouped convolution of x
 * [N, C, H, W] into y [N, M, OH, OW] at dilation 1, wt [C KH KW, MP] as pointwise_conv's (w [M, C KH
 * KW] transposed, zero columns past M), b [M] and residual z [N, M, OH, OW] or None, pads (top,
 * left), the bottom and right ones implied by y's size; C KH KW x OH OW at most SMALL_CONV_MAX_CELLS;
 * all float32 or all float64, C-contiguous; act as direct_conv's. */
static PyObject *small_conv(PyObject *module, PyObject *args) {
  PyObject *o_w, *o_x, *o_b, *o_z, *o_y;
  Py_ssize_t sh, sw, top, left, kh, kw;
  int act = DC_NONE;
  double p0 = 0, p1 = 0;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOOOO(nn)(nn)(nn)|idd", &o_w, &o_x, &o_b, &o_z, &o_y, &sh, &sw, &top, &left, &kh,
                        &kw, &act, &p0, &p1))
    return NULL;
  if (!conv_act_ok(act, "small_conv")) return NULL;
  if (sh < 1 || sw < 1 || kh < 1 || kw < 1 || top < 0 || left < 0) {
    PyErr_SetString(PyExc_ValueError, "small_conv: strides and kernel must be positive, pads not negative");
    return NULL;
  }
  Py_buffer bx, bw, bb, bz, by;
  int held = 0, has_b = 0, has_z = 0;
  PyObject *result = NULL;
  Py_ssize_t size = get_float_input(o_x, &bx, 4,
                                    "small_conv: x must be [N, C, H, W] float32 or float64, C-contiguous");
  if (!size) return NULL;
  held = 1;
  Py_ssize_t n = bx.shape[0], c = bx.shape[1], h = bx.shape[2], w = bx.shape[3];
  const char *fmt = size == 4 ? "f" : "d";
  if (get_buffer(o_w, &bw, "wt", size, fmt, -1, 0) < 0) goto done;
  held = 2;
  if (get_buffer(o_y, &by, "y", size, fmt, -1, 1) < 0) goto done;
  held = 3;
  Py_ssize_t k = c * kh * kw, m = by.ndim == 4 ? by.shape[1] : 0, mp = bw.ndim == 2 ? bw.shape[1] : 0;
  Py_ssize_t oh = by.ndim == 4 ? by.shape[2] : 0, ow = by.ndim == 4 ? by.shape[3] : 0, p = oh * ow;
  if (bw.ndim != 2 || by.ndim != 4 || bw.shape[0] != k || by.shape[0] != n || m < 1 || p < 1 || mp < m ||
      mp % PW_BLOCK) {
    PyErr_SetString(PyExc_ValueError, "small_conv: wt must be [C KH KW, MP] (MP a multiple of POINTWISE_BLOCK, at "
                    "least M) and y [N, M, OH, OW] of x's N");
    goto done;
  }
  if (k * p > SC_CELLS) { /* windows outside the input read as zeros: any y plane is safe */
    PyErr_SetString(PyExc_ValueError, "small_conv: C KH KW x OH OW is above SMALL_CONV_MAX_CELLS");
    goto done;
  }
  if (o_b != Py_None) {
    if (get_buffer(o_b, &bb, "b", size, fmt, m, 0) < 0) goto done;
    has_b = 1;
  }
  if (o_z != Py_None) {
    if (get_buffer(o_z, &bz, "z", size, fmt, n * m * p, 0) < 0) goto done;
    has_z = 1;
  }
  {
    double cols[SC_CELLS]; /* room for SC_CELLS of either type */
    for (Py_ssize_t i = 0; i < n; i++) {
      Py_ssize_t at = i * m * p;
      if (size == 4) {
        float *yi = (float *)by.buf + at;
        small_conv_cols_float((const float *)bx.buf + i * c * h * w, (float *)cols, c, h, w, kh, kw, oh, ow, sh,
                              sw, top, left);
        pointwise_conv_float(bw.buf, (float *)cols, has_b ? bb.buf : NULL, has_z ? (float *)bz.buf + at : NULL, yi,
                             1, k, m, mp, p, act, (float)p0, (float)p1);
        if (act == DC_HARD_SWISH) hard_swish_float(yi, m * p, (float)p0, (float)p1);
      } else {
        double *yi = (double *)by.buf + at;
        small_conv_cols_double((const double *)bx.buf + i * c * h * w, cols, c, h, w, kh, kw, oh, ow, sh, sw, top,
                               left);
        pointwise_conv_double(bw.buf, cols, has_b ? bb.buf : NULL, has_z ? (double *)bz.buf + at : NULL, yi, 1, k, m,
                              mp, p, act, p0, p1);
        if (act == DC_HARD_SWISH) hard_swish_double(yi, m * p, p0, p1);
      }
    }
  }
  Py_INCREF(Py_None);
  result = Py_None;
done:
  if (has_z) PyBuffer_Release(&bz);
  if (has_b) PyBuffer_Release(&bb);
  if (held >= 3) PyBuffer_Release(&by);
  if (held >= 2) PyBuffer_Release(&bw);
  if (held >= 1) PyBuffer_Release(&bx);
  return result;
}

/* ---- 3-D max pooling ---- */

/* The larger of a and b, NaN when either is (numpy's maximum, which the plain MaxPool takes). */
#define POOL_MAX(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))

/* The outputs [*i0, *i1) whose tap k lands inside an axis of n inputs: output i reads input
 * i * s + k * d - p. */
static void pool_tap_range(Py_ssize_t k, Py_ssize_t n, Py_ssize_t o, Py_ssize_t s, Py_ssize_t d, Py_ssize_t p,
                           Py_ssize_t *i0, Py_ssize_t *i1) {
  Py_ssize_t off = k * d - p;
  Py_ssize_t lo = off < 0 ? (-off + s - 1) / s : 0;
  Py_ssize_t hi = n - 1 - off >= 0 ? (n - 1 - off) / s + 1 : 0;
  if (hi > o) hi = o;
  *i0 = lo;
  *i1 = hi > lo ? hi : lo;
}

/* Each plane's windows reduced one axis at a time, frames, then rows, then columns: a window's
 * maximum is the maximum over its columns of the maxima over its rows of its frames' maxima, so a
 * kd x kh x kw window costs kd + kh + kw taps per output instead of their product. The frame and
 * row passes combine whole contiguous planes and rows (long SIMD loops) and shrink the data before
 * the column pass, whose loops are one output row each (short, strided for strided pools). Taps
 * that fall in the padding are left out, so a window of padding alone keeps the identity (-inf),
 * which the caller replaces. */
#define MAX_POOL_3D(NAME, T)                                                                                 \
  static VECTOR_CLONES void NAME(const T *RESTRICT x, T *RESTRICT y, T *RESTRICT t1, T *RESTRICT t2,         \
                                 Py_ssize_t planes, const Py_ssize_t *in, const Py_ssize_t *out,               \
                                 const Py_ssize_t *k, const Py_ssize_t *s, const Py_ssize_t *p,                \
                                 const Py_ssize_t *dl) {                                                     \
    const T low = -(T)INFINITY;                                                                              \
    Py_ssize_t D = in[0], H = in[1], W = in[2], OD = out[0], OH = out[1], OW = out[2];                       \
    Py_ssize_t plane = H * W;                                                                                \
    for (Py_ssize_t pl = 0; pl < planes; pl++) {                                                             \
      const T *xp = x + pl * D * plane;                                                                      \
      T *yp = y + pl * OD * OH * OW;                                                                         \
      /* frames: t1 [OD, H, W]; windows one frame deep at unit stride read x itself */                      \
      const T *f1 = xp;                                                                                      \
      if (k[0] != 1 || s[0] != 1 || p[0] != 0 || OD != D) {                                                  \
        for (Py_ssize_t i = 0; i < OD * plane; i++) t1[i] = low;                                             \
        for (Py_ssize_t t = 0; t < k[0]; t++) {                                                              \
          Py_ssize_t i0, i1;                                                                                 \
          pool_tap_range(t, D, OD, s[0], dl[0], p[0], &i0, &i1);                                             \
          for (Py_ssize_t o = i0; o < i1; o++) {                                                             \
            const T *src = xp + (o * s[0] + t * dl[0] - p[0]) * plane;                                       \
            T *dst = t1 + o * plane;                                                                         \
            for (Py_ssize_t i = 0; i < plane; i++) dst[i] = POOL_MAX(src[i], dst[i]);                        \
          }                                                                                                  \
        }                                                                                                    \
        f1 = t1;                                                                                             \
      }                                                                                                      \
      /* rows: t2 [OD, OH, W] */                                                                             \
      for (Py_ssize_t i = 0; i < OD * OH * W; i++) t2[i] = low;                                              \
      for (Py_ssize_t t = 0; t < k[1]; t++) {                                                                \
        Py_ssize_t i0, i1;                                                                                   \
        pool_tap_range(t, H, OH, s[1], dl[1], p[1], &i0, &i1);                                               \
        for (Py_ssize_t f = 0; f < OD; f++) {                                                                \
          const T *src = f1 + (f * H + i0 * s[1] + t * dl[1] - p[1]) * W;                                    \
          T *dst = t2 + (f * OH + i0) * W;                                                                   \
          if (s[1] == 1) { /* the tap's rows of consecutive outputs are consecutive: one stretch */          \
            for (Py_ssize_t i = 0; i < (i1 - i0) * W; i++) dst[i] = POOL_MAX(src[i], dst[i]);                \
            continue;                                                                                        \
          }                                                                                                  \
          for (Py_ssize_t o = i0; o < i1; o++, src += s[1] * W, dst += W)                                    \
            for (Py_ssize_t i = 0; i < W; i++) dst[i] = POOL_MAX(src[i], dst[i]);                            \
        }                                                                                                    \
      }                                                                                                      \
      /* columns: y [OD, OH, OW] */                                                                          \
      for (Py_ssize_t i = 0; i < OD * OH * OW; i++) yp[i] = low;                                             \
      for (Py_ssize_t t = 0; t < k[2]; t++) {                                                                \
        Py_ssize_t i0, i1, off = t * dl[2] - p[2];                                                           \
        pool_tap_range(t, W, OW, s[2], dl[2], p[2], &i0, &i1);                                               \
        for (Py_ssize_t r = 0; r < OD * OH; r++) {                                                           \
          const T *src = t2 + r * W + off;                                                                   \
          T *dst = yp + r * OW;                                                                              \
          if (s[2] == 1)                                                                                     \
            for (Py_ssize_t i = i0; i < i1; i++) dst[i] = POOL_MAX(src[i], dst[i]);                          \
          else                                                                                               \
            for (Py_ssize_t i = i0; i < i1; i++) dst[i] = POOL_MAX(src[i * s[2]], dst[i]);                   \
        }                                                                                                    \
      }                                                                                                      \
    }                                                                                                        \
  }

MAX_POOL_3D(max_pool_3d_float, float)
MAX_POOL_3D(max_pool_3d_double, double)

/* the pooling wrappers' common parts: y's rank and leading axes (x's N and C) checked, and the end
 * of a call (scratch and both buffers let go; None where the kernel ran, else the error raised) */
static int pool_output_ok(const Py_buffer *bx, const Py_buffer *by, int ndim, const char *msg) {
  if (by->ndim == ndim && by->shape[0] == bx->shape[0] && by->shape[1] == bx->shape[1]) return 1;
  PyErr_SetString(PyExc_ValueError, msg);
  return 0;
}

static PyObject *pool_release(int ran, void *scratch, Py_buffer *bx, Py_buffer *by) {
  PyMem_Free(scratch);
  PyBuffer_Release(by);
  PyBuffer_Release(bx);
  if (!ran) return NULL;
  Py_RETURN_NONE;
}

/* max_pool_3d(x, y, kernel, strides, pads, dilations): y [N, C, OD, OH, OW] (written) holds the
 * maximum of each window of x [N, C, D, H, W], both float32 or both float64, C-contiguous; pads are
 * the leading ones (front, top, left), the trailing ones implied by y's size; taps in the padding
 * are left out, and a window of padding alone gives -inf. */
static PyObject *max_pool_3d(PyObject *module, PyObject *args) {
  PyObject *o_x, *o_y;
  Py_ssize_t k[3], s[3], p[3], dl[3];
  (void)module;
  if (!PyArg_ParseTuple(args, "OO(nnn)(nnn)(nnn)(nnn)", &o_x, &o_y, &k[0], &k[1], &k[2], &s[0], &s[1], &s[2],
                        &p[0], &p[1], &p[2], &dl[0], &dl[1], &dl[2]))
    return NULL;
  Py_buffer bx, by;
  int ran = 0;
  void *scratch = NULL;
  Py_ssize_t size = get_float_input_output(o_x, o_y, &bx, &by, 5,
                                           "max_pool_3d: x must be [N, C, D, H, W] float32 or float64, C-contiguous");
  if (!size) return NULL;
  Py_ssize_t in[3] = {bx.shape[2], bx.shape[3], bx.shape[4]};
  if (!pool_output_ok(&bx, &by, 5, "max_pool_3d: y must be [N, C, OD, OH, OW] of x's N and C")) goto done;
  Py_ssize_t out[3] = {by.shape[2], by.shape[3], by.shape[4]};
  for (int a = 0; a < 3; a++)
    if (k[a] < 1 || s[a] < 1 || dl[a] < 1 || p[a] < 0 || out[a] < 1 || in[a] < 1) {
      PyErr_SetString(PyExc_ValueError, "max_pool_3d: kernel, strides and dilations at least 1, pads at least 0, "
                      "every axis of x and y at least 1 long");
      goto done;
    }
  Py_ssize_t planes = bx.shape[0] * bx.shape[1];
  Py_ssize_t n1 = out[0] * in[1] * in[2], n2 = out[0] * out[1] * in[2];
  scratch = PyMem_Malloc((size_t)(n1 + n2) * (size_t)size);
  if (!scratch) {
    PyErr_NoMemory();
    goto done;
  }
  PyThreadState *ts = planes * in[0] * in[1] * in[2] > 65536 ? PyEval_SaveThread() : NULL;
  if (size == 4)
    max_pool_3d_float(bx.buf, by.buf, scratch, (float *)scratch + n1, planes, in, out, k, s, p, dl);
  else
    max_pool_3d_double(bx.buf, by.buf, scratch, (double *)scratch + n1, planes, in, out, k, s, p, dl);
  if (ts) PyEval_RestoreThread(ts);
  ran = 1;
done:
  return pool_release(ran, scratch, &bx, &by);
}
/* ---- end of 3-D max pooling ---- */

/* ---- 2-D max pooling (pooling.py's native_2d) ----
 * One pass over each plane's output rows, every loop a contiguous one: the
 * window's input rows reduced into a row buffer holding -inf over the padding on both sides (set
 * once per call), then, for a strided pool, that buffer split into its sw column phases (phase p
 * holds columns p, p + sw, ...), so each tap column of a row of outputs is a contiguous stretch of
 * one phase where it would be a strided gather; then the maximum over the kw tap columns. The
 * maxima use POOL_MAX2, a branchless select (NaN kept as numpy's maximum, so as the plain kernel)
 * that compiles to two compares and a blend per vector (POOL_MAX's short-circuit || makes a branch
 * per element). Taken for small planes only (pooling.py's condition, docs/cpu-ep.md): a row's loop
 * is a partial vector and a scalar tail, cheaper than the gather plan's numpy calls but slower than
 * max_pool_3d's whole-plane row passes on planes of 14 columns and more. Rows of padding alone give
 * -inf, which the caller replaces. */
#define POOL_MAX2(a, b) ((((a) > (b)) | ((a) != (a))) ? (a) : (b))
#define MAX_POOL_2D(NAME, T)                                                                                 \
  static VECTOR_CLONES void NAME(const T *RESTRICT x, T *RESTRICT y, T *RESTRICT rb, T *RESTRICT ph,         \
                                 Py_ssize_t planes, Py_ssize_t H, Py_ssize_t W, Py_ssize_t OH, Py_ssize_t OW,  \
                                 Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t pt,    \
                                 Py_ssize_t pl, Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t pw) {               \
    T *RESTRICT in = rb + pl; /* the buffer's cells of the input's columns */                               \
    for (Py_ssize_t p = 0; p < planes; p++) {                                                                \
      const T *RESTRICT xp = x + p * H * W;                                                                  \
      T *RESTRICT yp = y + p * OH * OW;                                                                      \
      for (Py_ssize_t oy = 0; oy < OH; oy++) {                                                               \
        /* the window's rows r0 + i dh, i in [i0, i1), that lie in the input */                              \
        Py_ssize_t r0 = oy * sh - pt;                                                                        \
        Py_ssize_t i0 = r0 >= 0 ? 0 : (-r0 + dh - 1) / dh;                                                   \
        Py_ssize_t i1 = H - 1 - r0 >= 0 ? (H - 1 - r0) / dh + 1 : 0;                                         \
        if (i1 > kh) i1 = kh;                                                                                \
        if (i0 >= i1) {                                                                                      \
          for (Py_ssize_t q = 0; q < W; q++) in[q] = -(T)INFINITY;                                           \
        } else {                                                                                             \
          const T *RESTRICT src = xp + (r0 + i0 * dh) * W;                                                   \
          for (Py_ssize_t q = 0; q < W; q++) in[q] = src[q];                                                 \
          for (Py_ssize_t i = i0 + 1; i < i1; i++) {                                                         \
            src = xp + (r0 + i * dh) * W;                                                                    \
            for (Py_ssize_t q = 0; q < W; q++) in[q] = POOL_MAX2(src[q], in[q]);                             \
          }                                                                                                  \
        }                                                                                                    \
        const T *RESTRICT cells = rb;                                                                        \
        if (sw > 1) {                                                                                        \
          for (Py_ssize_t f = 0; f < sw; f++)                                                                \
            for (Py_ssize_t q = 0; q < pw; q++) ph[f * pw + q] = rb[q * sw + f];                             \
          cells = ph;                                                                                        \
        }                                                                                                    \
        /* tap j reads phase (j dw) % sw from its column (j dw) / sw on (one phase of pw when sw is 1) */    \
        T *RESTRICT d = yp + oy * OW;                                                                        \
        for (Py_ssize_t q = 0; q < OW; q++) d[q] = cells[q];                                                 \
        for (Py_ssize_t j = 1; j < kw; j++) {                                                                \
          const T *RESTRICT col = cells + ((j * dw) % sw) * pw + (j * dw) / sw;                              \
          for (Py_ssize_t q = 0; q < OW; q++) d[q] = POOL_MAX2(col[q], d[q]);                                \
        }                                                                                                    \
      }                                                                                                      \
    }                                                                                                        \
  }
MAX_POOL_2D(max_pool_2d_float, float)
MAX_POOL_2D(max_pool_2d_double, double)

/* max_pool_2d(x, y, kernel, strides, pads, dilations): y [N, C, OH, OW] (written) holds the maximum
 * of each window of x [N, C, H, W], both float32 or both float64, C-contiguous; pads the leading
 * ones (top, left), the trailing ones implied by y's size; taps in the padding are left out, and a
 * window of padding alone gives -inf. */
static PyObject *max_pool_2d(PyObject *module, PyObject *args) {
  PyObject *o_x, *o_y;
  Py_ssize_t kh, kw, sh, sw, pt, pl, dh, dw;
  (void)module;
  if (!PyArg_ParseTuple(args, "OO(nn)(nn)(nn)(nn)", &o_x, &o_y, &kh, &kw, &sh, &sw, &pt, &pl, &dh, &dw))
    return NULL;
  Py_buffer bx, by;
  int ran = 0;
  void *scratch = NULL;
  Py_ssize_t size = get_float_input_output(o_x, o_y, &bx, &by, 4,
                                           "max_pool_2d: x must be [N, C, H, W] float32 or float64, C-contiguous");
  if (!size) return NULL;
  Py_ssize_t h = bx.shape[2], w = bx.shape[3];
  if (!pool_output_ok(&bx, &by, 4, "max_pool_2d: y must be [N, C, OH, OW] of x's N and C")) goto done;
  Py_ssize_t oh = by.shape[2], ow = by.shape[3];
  if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || pt < 0 || pl < 0 || oh < 1 || ow < 1 || h < 1 ||
      w < 1) {
    PyErr_SetString(PyExc_ValueError, "max_pool_2d: kernel, strides and dilations at least 1, pads at least 0, "
                    "every axis of x and y at least 1 long");
    goto done;
  }
  /* each phase's cells: the outputs' plus the farthest tap's offset; the row buffer: the phases'
   * cells and the input row behind the left padding */
  Py_ssize_t pw = ow + ((kw - 1) * dw) / sw, wb = pw * sw;
  if (wb < pl + w) wb = pl + w;
  scratch = PyMem_Malloc((size_t)(wb + (sw > 1 ? pw * sw : 0)) * (size_t)size);
  if (!scratch) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t q = 0; q < wb; q++) { /* the padding's cells; the input's are written per row */
    if (size == 4)
      ((float *)scratch)[q] = -INFINITY;
    else
      ((double *)scratch)[q] = -INFINITY;
  }
  Py_ssize_t planes = bx.shape[0] * bx.shape[1];
  PyThreadState *ts = planes * h * w > 16384 ? PyEval_SaveThread() : NULL;
  if (size == 4)
    max_pool_2d_float(bx.buf, by.buf, scratch, (float *)scratch + wb, planes, h, w, oh, ow, kh, kw, sh, sw, pt, pl,
                      dh, dw, pw);
  else
    max_pool_2d_double(bx.buf, by.buf, scratch, (double *)scratch + wb, planes, h, w, oh, ow, kh, kw, sh, sw, pt,
                       pl, dh, dw, pw);
  if (ts) PyEval_RestoreThread(ts);
  ran = 1;
done:
  return pool_release(ran, scratch, &bx, &by);
}
/* ---- end of 2-D max pooling ---- */


/* ---- quantization (quantize.py's QUANTIZE_PATHS) ----
 * Each routine makes, element by element, the float32 operations of its numpy form in quantize.py
 * in the same order (a division by the scale, rint in the default rounding mode: half to even, as
 * numpy's rint and MLAS; clamps that return the bound for a NaN below and for a value equal to it,
 * as np.fmax and np.minimum do with a signed zero), so the results are that
 * form's bits; one pass where numpy takes four to six, for the small activations of quantized
 * transformers where each numpy call costs more than its arithmetic. */

/* codes of x: saturate(rint(x / s) + zp) into [lo, hi] as QuantizeLinear._apply (NaN: lo) */
#define QUANTIZE_TO(NAME, T)                                                                                 \
  static VECTOR_CLONES void NAME(const float *RESTRICT x, T *RESTRICT y, Py_ssize_t n, float s, float zp,     \
                                 float lo, float hi) {                                                      \
    for (Py_ssize_t i = 0; i < n; i++) {                                                                    \
      float v = __builtin_rintf(x[i] / s) + zp;                                                             \
      v = v > lo ? v : lo;                                                                                  \
      v = v < hi ? v : hi;                                                                                  \
      y[i] = (T)v;                                                                                          \
    }                                                                                                       \
  }
QUANTIZE_TO(quantize_int8, int8_t)
QUANTIZE_TO(quantize_uint8, uint8_t)
QUANTIZE_TO(quantize_int16, int16_t)
QUANTIZE_TO(quantize_uint16, uint16_t)

/* codes of exact integer sums: saturate(rint(acc * m) + zp) into [lo, hi], as ms_quantized's
 * _requantize (the product in float32, NaN: lo) */
#define REQUANTIZE_TO(NAME, T)                                                                               \
  static VECTOR_CLONES void NAME(const float *RESTRICT x, T *RESTRICT y, Py_ssize_t n, float m, float zp,     \
                                 float lo, float hi) {                                                      \
    for (Py_ssize_t i = 0; i < n; i++) {                                                                    \
      float v = __builtin_rintf(x[i] * m) + zp;                                                             \
      v = v > lo ? v : lo;                                                                                  \
      v = v < hi ? v : hi;                                                                                  \
      y[i] = (T)v;                                                                                          \
    }                                                                                                       \
  }
REQUANTIZE_TO(requantize_int8, int8_t)
REQUANTIZE_TO(requantize_uint8, uint8_t)

/* values of codes: (x - zp) * s, the difference exact in int32 and converted to float32 (exact for
 * 8- and 16-bit codes), as DequantizeLinear._apply */
#define DEQUANTIZE_FROM(NAME, T)                                                                             \
  static VECTOR_CLONES void NAME(const T *RESTRICT x, float *RESTRICT y, Py_ssize_t n, float s, int32_t zp) { \
    for (Py_ssize_t i = 0; i < n; i++) y[i] = (float)((int32_t)x[i] - zp) * s;                               \
  }
DEQUANTIZE_FROM(dequantize_int8, int8_t)
DEQUANTIZE_FROM(dequantize_uint8, uint8_t)
DEQUANTIZE_FROM(dequantize_int16, int16_t)
DEQUANTIZE_FROM(dequantize_uint16, uint16_t)

/* QuantizeDequantize's fast form: clamp(rint(x / s), lo, hi) + 0.0, times s (lo, hi: the codes'
 * range less the zero point) */
static VECTOR_CLONES void quantize_dequantize_float(const float *RESTRICT x, float *RESTRICT y, Py_ssize_t n, float s,
                                                   float lo, float hi) {
  for (Py_ssize_t i = 0; i < n; i++) {
    float v = __builtin_rintf(x[i] / s);
    v = v > lo ? v : lo;
    v = v < hi ? v : hi;
    v = v + 0.0f;
    y[i] = v * s;
  }
}

/* the smallest and largest non-NaN value and 0, in 16 independent lanes (GCC's vector extension:
 * a comparison gives a lane mask, the select is a blend; a NaN compares false, so it is left out),
 * and whether a NaN was seen */
#define DQ_LANES 16
typedef float dq_vf __attribute__((vector_size(DQ_LANES * sizeof(float))));
typedef int32_t dq_vi __attribute__((vector_size(DQ_LANES * sizeof(int32_t))));
static VECTOR_CLONES void float_range(const float *RESTRICT x, Py_ssize_t n, float *lo_out, float *hi_out, int *nan_out) {
  dq_vf lo = {0}, hi = {0};
  dq_vi nan = {0};
  Py_ssize_t i = 0;
  for (; i + DQ_LANES <= n; i += DQ_LANES) {
    dq_vf v;
    memcpy(&v, x + i, sizeof v);
    dq_vi below = v < lo, above = v > hi;
    lo = (dq_vf)((below & (dq_vi)v) | (~below & (dq_vi)lo));
    hi = (dq_vf)((above & (dq_vi)v) | (~above & (dq_vi)hi));
    nan |= v != v;
  }
  float l = 0.0f, h = 0.0f;
  int any = 0;
  for (int j = 0; j < DQ_LANES; j++) {
    l = lo[j] < l ? lo[j] : l;
    h = hi[j] > h ? hi[j] : h;
    any |= nan[j];
  }
  for (; i < n; i++) {
    float v = x[i];
    l = v < l ? v : l;
    h = v > h ? v : h;
    any |= v != v;
  }
  *lo_out = l;
  *hi_out = h;
  *nan_out = any;
}

/* f = x / s, clamped to [lo, hi] first where `clamp` (NaN: lo), rounded: dynamic_quantize_centered's
 * codes less their zero point */
static VECTOR_CLONES void centered_codes(const float *RESTRICT x, float *RESTRICT f, Py_ssize_t n, float s, float lo,
                                         float hi, int clamp) {
  if (clamp)
    for (Py_ssize_t i = 0; i < n; i++) {
      float v = x[i] / s;
      v = v > lo ? v : lo;
      v = v < hi ? v : hi;
      f[i] = __builtin_rintf(v);
    }
  else
    for (Py_ssize_t i = 0; i < n; i++) f[i] = __builtin_rintf(x[i] / s);
}

/* quantize_linear(x, y, scale, zero_point, lo, hi): y = saturate(rint(x / scale) + zero_point) into
 * [lo, hi], x float32, y int8, uint8, int16 or uint16 of x's size, both C-contiguous. */
static PyObject *quantize_linear(PyObject *module, PyObject *args) {
  PyObject *o_x, *o_y;
  float s, zp, lo, hi;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOffff", &o_x, &o_y, &s, &zp, &lo, &hi)) return NULL;
  Py_buffer bx, by;
  if (get_buffer(o_x, &bx, "quantize_linear: x", 4, "f", -1, 0) < 0) return NULL;
  if (PyObject_GetBuffer(o_y, &by, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
    PyBuffer_Release(&bx);
    return NULL;
  }
  Py_ssize_t n = bx.len / 4;
  const char *f = by.format ? by.format : "B";
  if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
  if (strlen(f) != 1 || !strchr("bBhH", f[0]) || by.itemsize != (f[0] == 'b' || f[0] == 'B' ? 1 : 2) ||
      by.len != n * by.itemsize) {
    PyBuffer_Release(&bx);
    PyBuffer_Release(&by);
    PyErr_SetString(PyExc_ValueError, "quantize_linear: y must be int8, uint8, int16 or uint16 with x's size");
    return NULL;
  }
  switch (f[0]) {
    case 'b': quantize_int8(bx.buf, by.buf, n, s, zp, lo, hi); break;
    case 'B': quantize_uint8(bx.buf, by.buf, n, s, zp, lo, hi); break;
    case 'h': quantize_int16(bx.buf, by.buf, n, s, zp, lo, hi); break;
    default: quantize_uint16(bx.buf, by.buf, n, s, zp, lo, hi); break;
  }
  PyBuffer_Release(&bx);
  PyBuffer_Release(&by);
  Py_RETURN_NONE;
}

/* dequantize_linear(x, y, scale, zero_point): y = (x - zero_point) * scale, x int8, uint8, int16 or
 * uint16, y float32 of x's size, both C-contiguous. */
static PyObject *dequantize_linear(PyObject *module, PyObject *args) {
  PyObject *o_x, *o_y;
  float s;
  int zp;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOfi", &o_x, &o_y, &s, &zp)) return NULL;
  Py_buffer bx, by;
  if (PyObject_GetBuffer(o_x, &bx, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
  const char *f = bx.format ? bx.format : "B";
  if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
  if (strlen(f) != 1 || !strchr("bBhH", f[0]) || bx.itemsize != (f[0] == 'b' || f[0] == 'B' ? 1 : 2)) {
    PyBuffer_Release(&bx);
    PyErr_SetString(PyExc_ValueError, "dequantize_linear: x must be int8, uint8, int16 or uint16");
    return NULL;
  }
  Py_ssize_t n = bx.len / bx.itemsize;
  if (get_buffer(o_y, &by, "dequantize_linear: y", 4, "f", n, 1) < 0) {
    PyBuffer_Release(&bx);
    return NULL;
  }
  switch (f[0]) {
    case 'b': dequantize_int8(bx.buf, by.buf, n, s, zp); break;
    case 'B': dequantize_uint8(bx.buf, by.buf, n, s, zp); break;
    case 'h': dequantize_int16(bx.buf, by.buf, n, s, zp); break;
    default: dequantize_uint16(bx.buf, by.buf, n, s, zp); break;
  }
  PyBuffer_Release(&bx);
  PyBuffer_Release(&by);
  Py_RETURN_NONE;
}

/* requantize(acc, y, multiplier, zero_point, lo, hi): y = saturate(rint(acc * multiplier) +
 * zero_point) into [lo, hi], acc float32, y int8 or uint8 of acc's size, both C-contiguous. */
static PyObject *requantize(PyObject *module, PyObject *args) {
  PyObject *o_x, *o_y;
  float m, zp, lo, hi;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOffff", &o_x, &o_y, &m, &zp, &lo, &hi)) return NULL;
  Py_buffer bx, by;
  if (get_buffer(o_x, &bx, "requantize: acc", 4, "f", -1, 0) < 0) return NULL;
  if (get_buffer(o_y, &by, "requantize: y", 1, "bB", bx.len / 4, 1) < 0) {
    PyBuffer_Release(&bx);
    return NULL;
  }
  const char *f = by.format ? by.format : "B";
  if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
  if (f[0] == 'b')
    requantize_int8(bx.buf, by.buf, bx.len / 4, m, zp, lo, hi);
  else
    requantize_uint8(bx.buf, by.buf, bx.len / 4, m, zp, lo, hi);
  PyBuffer_Release(&bx);
  PyBuffer_Release(&by);
  Py_RETURN_NONE;
}

/* quantize_dequantize(x, y, scale, lo, hi): y = (clamp(rint(x / scale), lo, hi) + 0.0) * scale, x and
 * y float32 of one size, C-contiguous (y may be x). */
static PyObject *quantize_dequantize(PyObject *module, PyObject *args) {
  PyObject *o_x, *o_y;
  float s, lo, hi;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOfff", &o_x, &o_y, &s, &lo, &hi)) return NULL;
  Py_buffer bx, by;
  if (get_buffer(o_x, &bx, "quantize_dequantize: x", 4, "f", -1, 0) < 0) return NULL;
  if (get_buffer(o_y, &by, "quantize_dequantize: y", 4, "f", bx.len / 4, 1) < 0) {
    PyBuffer_Release(&bx);
    return NULL;
  }
  quantize_dequantize_float(bx.buf, by.buf, bx.len / 4, s, lo, hi);
  PyBuffer_Release(&bx);
  PyBuffer_Release(&by);
  Py_RETURN_NONE;
}

/* dynamic_quantize(x, f) -> (scale, zero_point): onnxruntime's dynamic uint8 quantization of x
 * (float32, C-contiguous, at least one value) as quantize.py's dynamic_quantize_centered computes
 * it, the codes less the zero point written to f (float32, x's size): range widened to hold 0, NaNs
 * left out; scale (max - min) / 255 (1 for a zero range); zero point rint(min(-min / scale, 255))
 * (0 at or below 0, 255 for NaN); the clamp to [-zp, 255 - zp] made only where numpy's form makes
 * it (a NaN, or a range end whose code could leave [0, 255]), so a -0.0 code is that form's too. */
static PyObject *dynamic_quantize(PyObject *module, PyObject *args) {
  PyObject *o_x, *o_f;
  (void)module;
  if (!PyArg_ParseTuple(args, "OO", &o_x, &o_f)) return NULL;
  Py_buffer bx, bf;
  if (get_buffer(o_x, &bx, "dynamic_quantize: x", 4, "f", -1, 0) < 0) return NULL;
  if (get_buffer(o_f, &bf, "dynamic_quantize: f", 4, "f", bx.len / 4, 1) < 0) {
    PyBuffer_Release(&bx);
    return NULL;
  }
  Py_ssize_t n = bx.len / 4;
  float lo, hi;
  int nan;
  float_range(bx.buf, n, &lo, &hi, &nan);
  float scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
  double v = (double)(-lo / scale);
  v = v < 255.0 ? v : 255.0; /* std::min(qmax, v): NaN gives qmax */
  int zp = v > 0.0 ? (int)nearbyint(v) : 0;
  double top = (double)(hi / scale), bottom = (double)(lo / scale);
  int clamp = !(!nan && -256.0 < bottom && top < 256.0 && nearbyint(top) <= 255 - zp && nearbyint(bottom) >= -zp);
  centered_codes(bx.buf, bf.buf, n, scale, (float)(-zp), (float)(255 - zp), clamp);
  PyBuffer_Release(&bx);
  PyBuffer_Release(&bf);
  return Py_BuildValue("di", (double)scale, zp);
}
/* ---- end of quantization ---- */


/* ---- layer normalization of small inputs (normalization.py's LAYER_NORM_PATHS) ----
 * normalization._layer_norm_small's arithmetic row by row: mean and variance as sums of x / n and
 * (x - mean)^2 / n in double (that form's BLAS products with a column of 1/n, here four partial sums
 * each: within a few double ulps of BLAS's order),
 * 1 / sqrt(var + eps), then (float)(d * inv) * scale + bias in float32, rounded after each operation
 * (no contraction into FMA) as numpy's passes. */
__attribute__((optimize("fp-contract=off"))) static void layer_norm_float(const float *RESTRICT x, const float *RESTRICT g,
                                                                         const float *RESTRICT b, float *RESTRICT y,
                                                                         double *RESTRICT mean_out,
                                                                         double *RESTRICT inv_out, Py_ssize_t rows,
                                                                         Py_ssize_t n, double eps) {
  double inv_n = 1.0 / (double)n;
  for (Py_ssize_t r = 0; r < rows; r++) {
    const float *xr = x + r * n;
    float *yr = y + r * n;
    /* four partial sums each: the latency of one chain of double additions is most of a row */
    double s4[4] = {0.0, 0.0, 0.0, 0.0}, v4[4] = {0.0, 0.0, 0.0, 0.0};
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4)
      for (int j = 0; j < 4; j++) s4[j] += (double)xr[i + j] * inv_n;
    for (; i < n; i++) s4[0] += (double)xr[i] * inv_n;
    double s = (s4[0] + s4[1]) + (s4[2] + s4[3]);
    for (i = 0; i + 4 <= n; i += 4)
      for (int j = 0; j < 4; j++) {
        double d = (double)xr[i + j] - s;
        v4[j] += d * d * inv_n;
      }
    for (; i < n; i++) {
      double d = (double)xr[i] - s;
      v4[0] += d * d * inv_n;
    }
    double v = (v4[0] + v4[1]) + (v4[2] + v4[3]);
    double inv = 1.0 / sqrt(v + eps);
    for (i = 0; i < n; i++) {
      float t = (float)(((double)xr[i] - s) * inv);
      t = t * g[i];
      yr[i] = b ? t + b[i] : t;
    }
    mean_out[r] = s;
    inv_out[r] = inv;
  }
}

/* layer_norm(x, scale, bias, y, mean, inv_std, eps): each row of n = len(scale) values of x
 * normalized into y, times scale plus bias (or None); each row's mean and 1 / sqrt(var + eps) into
 * mean and inv_std (float64 [rows]). x, y float32 [rows * n]; scale, bias float32 [n]. */
static PyObject *layer_norm(PyObject *module, PyObject *args) {
  PyObject *o_x, *o_g, *o_b, *o_y, *o_m, *o_i;
  double eps;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOOOOOd", &o_x, &o_g, &o_b, &o_y, &o_m, &o_i, &eps)) return NULL;
  Py_buffer bx, bg, bb, by, bm, bi;
  int held = 0;
  PyObject *result = NULL;
  if (get_buffer(o_g, &bg, "layer_norm: scale", 4, "f", -1, 0) < 0) return NULL;
  held = 1;
  Py_ssize_t n = bg.len / 4;
  if (n < 1) {
    PyErr_SetString(PyExc_ValueError, "layer_norm: scale must hold at least one value");
    goto done;
  }
  if (get_buffer(o_x, &bx, "layer_norm: x", 4, "f", -1, 0) < 0) goto done;
  held = 2;
  Py_ssize_t rows = bx.len / 4 / n;
  if (rows * n * 4 != bx.len) {
    PyErr_SetString(PyExc_ValueError, "layer_norm: x must hold whole rows of len(scale) values");
    goto done;
  }
  if (get_buffer(o_y, &by, "layer_norm: y", 4, "f", rows * n, 1) < 0) goto done;
  held = 3;
  if (get_buffer(o_m, &bm, "layer_norm: mean", 8, "d", rows, 1) < 0) goto done;
  held = 4;
  if (get_buffer(o_i, &bi, "layer_norm: inv_std", 8, "d", rows, 1) < 0) goto done;
  held = 5;
  if (o_b != Py_None) {
    if (get_buffer(o_b, &bb, "layer_norm: bias", 4, "f", n, 0) < 0) goto done;
    held = 6;
  }
  layer_norm_float(bx.buf, bg.buf, held >= 6 ? bb.buf : NULL, by.buf, bm.buf, bi.buf, rows, n, eps);
  Py_INCREF(Py_None);
  result = Py_None;
done:
  if (held >= 6) PyBuffer_Release(&bb);
  if (held >= 5) PyBuffer_Release(&bi);
  if (held >= 4) PyBuffer_Release(&bm);
  if (held >= 3) PyBuffer_Release(&by);
  if (held >= 2) PyBuffer_Release(&bx);
  PyBuffer_Release(&bg);
  return result;
}
/* ---- end of layer normalization ---- */


/* ---- RMS normalization rows (rms_group_norm.py's RMS_NORM_PATHS) ----
 * Each row of n float32 values: the sum of squares in double (four partial sums: one chain of double
 * additions is most of a short row), inv = 1 / sqrt(sum / n + eps) in double, then
 * (float)(x * inv) * scale in float32, as onnxruntime's simplified LayerNormImpl accumulates in double
 * (onnxruntime/core/providers/cpu/nn/layer_norm_impl.cc). No contraction into FMA. */
__attribute__((optimize("fp-contract=off"))) static void rms_norm_float(const float *RESTRICT x, const float *RESTRICT g,
                                                                       float *RESTRICT y, float *RESTRICT inv_out,
                                                                       Py_ssize_t rows, Py_ssize_t n, double eps) {
  for (Py_ssize_t r = 0; r < rows; r++) {
    const float *xr = x + r * n;
    float *yr = y + r * n;
    double s4[4] = {0.0, 0.0, 0.0, 0.0};
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4)
      for (int j = 0; j < 4; j++) s4[j] += (double)xr[i + j] * (double)xr[i + j];
    for (; i < n; i++) s4[0] += (double)xr[i] * (double)xr[i];
    double inv = 1.0 / sqrt(((s4[0] + s4[1]) + (s4[2] + s4[3])) / (double)n + eps);
    for (i = 0; i < n; i++) yr[i] = (float)((double)xr[i] * inv) * g[i];
    if (inv_out) inv_out[r] = (float)inv;
  }
}

/* rms_norm(x, scale, y, inv, eps): each row of n = len(scale) values of x normalized by its root
 * mean square into y, times scale; each row's 1 / rms into inv (float32 [rows]) unless inv is None.
 * x, y float32 [rows * n]; scale float32 [n]. */
static PyObject *rms_norm(PyObject *module, PyObject *args) {
  PyObject *o_x, *o_g, *o_y, *o_i;
  double eps;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOOOd", &o_x, &o_g, &o_y, &o_i, &eps)) return NULL;
  Py_buffer bx, bg, by, bi;
  int held = 0;
  PyObject *result = NULL;
  if (get_buffer(o_g, &bg, "rms_norm: scale", 4, "f", -1, 0) < 0) return NULL;
  held = 1;
  Py_ssize_t n = bg.len / 4;
  if (n < 1) {
    PyErr_SetString(PyExc_ValueError, "rms_norm: scale must hold at least one value");
    goto done;
  }
  if (get_buffer(o_x, &bx, "rms_norm: x", 4, "f", -1, 0) < 0) goto done;
  held = 2;
  Py_ssize_t rows = bx.len / 4 / n;
  if (rows * n * 4 != bx.len) {
    PyErr_SetString(PyExc_ValueError, "rms_norm: x must hold whole rows of len(scale) values");
    goto done;
  }
  if (get_buffer(o_y, &by, "rms_norm: y", 4, "f", rows * n, 1) < 0) goto done;
  held = 3;
  if (o_i != Py_None) {
    if (get_buffer(o_i, &bi, "rms_norm: inv", 4, "f", rows, 1) < 0) goto done;
    held = 4;
  }
  rms_norm_float(bx.buf, bg.buf, by.buf, held >= 4 ? bi.buf : NULL, rows, n, eps);
  Py_INCREF(Py_None);
  result = Py_None;
done:
  if (held >= 4) PyBuffer_Release(&bi);
  if (held >= 3) PyBuffer_Release(&by);
  if (held >= 2) PyBuffer_Release(&bx);
  PyBuffer_Release(&bg);
  return result;
}
/* ---- end of RMS normalization rows ---- */


/* ---- softmax over rows (numerics.py's FAST_PATHS["softmax_native"]) ---- */
/* exp(z) for z <= 0 as tanh_floats computes it: 2^n exp(f), |f| <= ln2 / 2, Taylor to f^7 (error
 * under 1e-8 relative, then float rounding); 0 below -87 (where float's exp is subnormal or 0) */
static inline ALWAYS_INLINE NO_TRAPPING_MATH float exp_nonpositive(float z) {
  const float magic = 12582912.0f;
  int32_t magic_bits;
  memcpy(&magic_bits, &magic, 4);
  float zc = z > -87.0f ? z : -87.0f;
  float r = zc * 1.44269504088896341f + magic;
  int32_t rbits;
  memcpy(&rbits, &r, 4);
  int32_t ni = rbits - magic_bits;
  float nf = r - magic;
  float f = (zc - nf * 0.693145751953125f) - nf * 1.42860682030941723212e-6f;
  float p = 1.0f + f * (1.0f + f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120 + f * (1.0f / 720 +
            f * (1.0f / 5040)))))));
  int32_t sbits = (ni + 127) << 23;
  float scale;
  memcpy(&scale, &sbits, 4);
  return z > -87.0f ? p * scale : 0.0f;
}

/* y = exp(y) in place over a flat run of non-positive values (one loop the compiler vectorizes) */
static VECTOR_CLONES void exp_nonpositive_floats(float *RESTRICT y, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; i++) y[i] = exp_nonpositive(y[i]);
}

/* softmax of each row of n floats into y: x - max row by row, exp over the whole array in one
 * vectorized pass (-inf gives 0, as exp), each row's sum in double, divided; returns 0 without
 * finishing where a row holds a NaN or +inf or is -inf throughout (the caller runs the canonical
 * form) */
/* the largest of n > 0 floats, vectorized; exact for finite values and -inf (a row holding a NaN or
 * +inf is refused by row_not_finite, so what it gives for one does not matter; of +0 and -0 either
 * may come back, and x - m, then exp, is the same for both) */
static VECTOR_CLONES_FINITE float row_max(const float *RESTRICT x, Py_ssize_t n) {
  float m = x[0];
  for (Py_ssize_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
  return m;
}
/* whether any of n floats is a NaN or +inf */
static VECTOR_CLONES int row_not_finite(const float *RESTRICT x, Py_ssize_t n) {
  int bad = 0;
  for (Py_ssize_t i = 0; i < n; i++) bad |= (x[i] != x[i]) | (x[i] > FLT_MAX);
  return bad;
}
/* y = x - m over n floats */
static VECTOR_CLONES void row_minus(const float *RESTRICT x, float *RESTRICT y, Py_ssize_t n, float m) {
  for (Py_ssize_t i = 0; i < n; i++) y[i] = x[i] - m;
}
/* the sum of n floats in double, in 8 interleaved partial sums combined in a fixed order (the same
 * in every clone), which the compiler vectorizes where one running sum waits on each add */
static VECTOR_CLONES double row_sum_double(const float *RESTRICT y, Py_ssize_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  Py_ssize_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) s[k] += y[i + k];
  double tail = 0.0;
  for (; i < n; i++) tail += y[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail;
}
/* y /= total over n floats */
static VECTOR_CLONES void row_divide(float *RESTRICT y, Py_ssize_t n, float total) {
  for (Py_ssize_t i = 0; i < n; i++) y[i] = y[i] / total;
}
/* rows of at least SOFTMAX_WIDE values (attention over a 16x16 map: 256) go through the vectorized
 * row helpers above: 1.13 -> 0.38 ms on [2, 4, 256, 256], 36.7 -> 11.0 us on [16, 1000], the same
 * bits; shorter rows stay in the scalar loops below, where the helpers' calls save nothing */
#define SOFTMAX_WIDE 64
static int softmax_rows_wide(const float *RESTRICT x, float *RESTRICT y, Py_ssize_t rows, Py_ssize_t n) {
  for (Py_ssize_t r = 0; r < rows; r++) {
    float m = row_max(x + r * n, n);
    if (row_not_finite(x + r * n, n) || m < -FLT_MAX) return 0; /* (a row of -inf alone: the canonical NaN) */
    row_minus(x + r * n, y + r * n, n, m);
  }
  exp_nonpositive_floats(y, rows * n);
  for (Py_ssize_t r = 0; r < rows; r++) row_divide(y + r * n, n, (float)row_sum_double(y + r * n, n));
  return 1;
}
static int softmax_rows_float(const float *RESTRICT x, float *RESTRICT y, Py_ssize_t rows, Py_ssize_t n) {
  if (n >= SOFTMAX_WIDE) return softmax_rows_wide(x, y, rows, n);
  for (Py_ssize_t r = 0; r < rows; r++) {
    const float *xr = x + r * n;
    float *yr = y + r * n;
    float m = xr[0];
    int bad = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
      m = xr[i] > m ? xr[i] : m;
      bad |= (xr[i] != xr[i]) | (xr[i] > FLT_MAX); /* NaN or +inf */
    }
    if (bad || m < -FLT_MAX) return 0; /* (a row of -inf alone: the canonical form's NaN) */
    for (Py_ssize_t i = 0; i < n; i++) yr[i] = xr[i] - m;
  }
  exp_nonpositive_floats(y, rows * n);
  for (Py_ssize_t r = 0; r < rows; r++) {
    float *yr = y + r * n;
    double sum = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) sum += yr[i];
    float total = (float)sum;
    for (Py_ssize_t i = 0; i < n; i++) yr[i] = yr[i] / total;
  }
  return 1;
}

/* softmax_rows(x, y, n) -> bool: softmax over rows of n values of x (float32, C-contiguous) into y
 * (float32, x's size); False, y partly written, where a row holds a NaN or +inf or is -inf
 * throughout. */
static PyObject *softmax_rows(PyObject *module, PyObject *args) {
  PyObject *o_x, *o_y;
  Py_ssize_t n;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOn", &o_x, &o_y, &n)) return NULL;
  Py_buffer bx, by;
  if (get_buffer(o_x, &bx, "softmax_rows: x", 4, "f", -1, 0) < 0) return NULL;
  if (get_buffer(o_y, &by, "softmax_rows: y", 4, "f", bx.len / 4, 1) < 0) {
    PyBuffer_Release(&bx);
    return NULL;
  }
  if (n < 1 || (bx.len / 4) % n) {
    PyBuffer_Release(&bx);
    PyBuffer_Release(&by);
    PyErr_SetString(PyExc_ValueError, "softmax_rows: n must be at least 1 and divide x's size");
    return NULL;
  }
  int done = softmax_rows_float(bx.buf, by.buf, bx.len / 4 / n, n);
  PyBuffer_Release(&bx);
  PyBuffer_Release(&by);
  return PyBool_FromLong(done);
}
/* ---- end of softmax over rows ---- */


/* ---- attention of few scores (onnx_attention.py's ATTENTION_PATHS["native_small"]) ----
 * softmax(q k^T * scale + mask) v for each query row, the query heads sharing a key-value head read
 * as `rows` = rep * S rows of it (onnx_attention._grouped_rows's layout). A key is seen where the
 * boolean mask holds (mask [MB, MS, T], MB 1 or B, MS 1 or S) and, with offset >= 0 (is_causal),
 * key j <= query i + offset; a row that sees no key gives zeros (the specification's reference).
 * Each score a float dot product times scale; the softmax as softmax_rows computes it (x - max,
 * exp_nonpositive, the sum in double, divided in float); the output the probabilities' weighted sum
 * of the values in float. Returns 0 without finishing where a score is NaN or infinite (the caller
 * runs its numpy form). p: scratch of t floats. */
static int attention_small_float(const float *RESTRICT q, const float *RESTRICT k, const float *RESTRICT v,
                                 const unsigned char *RESTRICT mask, float *RESTRICT out, float *RESTRICT p,
                                 Py_ssize_t b, Py_ssize_t kvh, Py_ssize_t rows, Py_ssize_t s, Py_ssize_t t,
                                 Py_ssize_t d, Py_ssize_t dv, Py_ssize_t mb, Py_ssize_t ms, Py_ssize_t offset,
                                 float scale) {
  for (Py_ssize_t bi = 0; bi < b; bi++)
    for (Py_ssize_t g = 0; g < kvh; g++) {
      const float *kb = k + (bi * kvh + g) * t * d, *vb = v + (bi * kvh + g) * t * dv;
      const unsigned char *mb_base = mask ? mask + (mb > 1 ? bi : 0) * ms * t : NULL;
      for (Py_ssize_t r = 0; r < rows; r++) {
        Py_ssize_t i = r % s;
        const float *qr = q + ((bi * kvh + g) * rows + r) * d;
        float *o = out + ((bi * kvh + g) * rows + r) * dv;
        const unsigned char *mr = mask ? mb_base + (ms > 1 ? i : 0) * t : NULL;
        Py_ssize_t jmax = offset >= 0 && i + offset + 1 < t ? i + offset + 1 : t;
        float m = -INFINITY;
        int seen = 0;
        for (Py_ssize_t j = 0; j < t; j++) {
          if (j >= jmax || (mr && !mr[j])) {
            p[j] = -INFINITY;
            continue;
          }
          const float *kr = kb + j * d;
          float acc = 0.0f;
          for (Py_ssize_t c = 0; c < d; c++) acc += qr[c] * kr[c];
          acc *= scale;
          if (!(acc >= -FLT_MAX && acc <= FLT_MAX)) return 0;
          p[j] = acc;
          m = acc > m ? acc : m;
          seen = 1;
        }
        for (Py_ssize_t c = 0; c < dv; c++) o[c] = 0.0f;
        if (!seen) continue;
        double total = 0.0;
        for (Py_ssize_t j = 0; j < t; j++) {
          p[j] = p[j] == -INFINITY ? 0.0f : exp_nonpositive(p[j] - m);
          total += p[j];
        }
        float tot = (float)total;
        for (Py_ssize_t j = 0; j < t; j++) {
          /* no skip of zero weights: a masked key's NaN or inf value gives NaN (0 * NaN), as the
             plain path and onnxruntime multiply every value */
          float w = p[j] / tot;
          const float *vr = vb + j * dv;
          for (Py_ssize_t c = 0; c < dv; c++) o[c] += w * vr[c];
        }
      }
    }
  return 1;
}

/* attention_small(q, k, v, mask, out, dims, offset, scale) -> bool: dims (b, kvh, rows, s, t, d, dv,
 * mb, ms); q float32 [b * kvh * rows * d], k [b * kvh * t * d], v [b * kvh * t * dv], mask bool
 * [mb * ms * t] or None, out float32 [b * kvh * rows * dv]; offset < 0: not causal. False where a
 * score is not finite (out then unfinished). */
static PyObject *attention_small(PyObject *module, PyObject *args) {
  PyObject *o_q, *o_k, *o_v, *o_m, *o_o;
  Py_ssize_t b, kvh, rows, s, t, d, dv, mb, ms, offset;
  float scale;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOOOO(nnnnnnnnn)nf", &o_q, &o_k, &o_v, &o_m, &o_o, &b, &kvh, &rows, &s, &t, &d, &dv,
                        &mb, &ms, &offset, &scale))
    return NULL;
  if (b < 1 || kvh < 1 || rows < 1 || s < 1 || t < 1 || d < 1 || dv < 1 || mb < 1 || ms < 1 || rows % s ||
      (mb != 1 && mb != b) || (ms != 1 && ms != s)) {
    PyErr_SetString(PyExc_ValueError, "attention_small: dims must be positive, rows a multiple of s, mb 1 or b, "
                    "ms 1 or s");
    return NULL;
  }
  Py_buffer bq, bk, bv, bo, bm;
  PyObject *const objs[4] = {o_q, o_k, o_v, o_o};
  const char *const what[4] = {"attention_small: q", "attention_small: k", "attention_small: v",
                               "attention_small: out"};
  const Py_ssize_t counts[4] = {b * kvh * rows * d, b * kvh * t * d, b * kvh * t * dv, b * kvh * rows * dv};
  Py_buffer views[4];
  if (get_buffers(3, views, objs, what, 4, "f", counts, 0) < 0) return NULL;
  if (get_buffer(o_o, &views[3], what[3], 4, "f", counts[3], 1) < 0) {
    release_buffers(3, views);
    return NULL;
  }
  bq = views[0], bk = views[1], bv = views[2], bo = views[3];
  int has_mask = o_m != Py_None;
  if (has_mask && get_buffer(o_m, &bm, "attention_small: mask", 1, "?", mb * ms * t, 0) < 0) {
    release_buffers(4, views);
    return NULL;
  }
  float *p = PyMem_Malloc((size_t)t * sizeof(float));
  int done = 0;
  if (p) {
    done = attention_small_float(bq.buf, bk.buf, bv.buf, has_mask ? bm.buf : NULL, bo.buf, p, b, kvh, rows, s, t, d,
                                 dv, mb, ms, offset, scale);
    PyMem_Free(p);
  }
  if (has_mask) PyBuffer_Release(&bm);
  release_buffers(4, views);
  if (!p) return PyErr_NoMemory();
  return PyBool_FromLong(done);
}
/* ---- end of attention of few scores ---- */


/* ---- rotary embedding (onnx_attention.py's ROTARY_PATHS["native_rows"]) ----
 * ms_decoder_attention.rotate's arithmetic, to the bit (float32, no contraction into FMA): the first
 * 2 * half features of each head's row rotated by the cache row of its position, halves (x1, x2) ->
 * (x1 cos - x2 sin, x2 cos + x1 sin) or adjacent pairs when interleaved, the rest copied. */
__attribute__((optimize("fp-contract=off"))) static void rotary_row(const float *RESTRICT x, float *RESTRICT y,
                                                                   const float *RESTRICT c, const float *RESTRICT sn,
                                                                   Py_ssize_t h, Py_ssize_t half, int interleaved) {
  if (interleaved) {
    for (Py_ssize_t i = 0; i < half; i++) {
      float a = x[2 * i], b = x[2 * i + 1];
      y[2 * i] = a * c[i] - b * sn[i];
      y[2 * i + 1] = b * c[i] + a * sn[i];
    }
  } else {
    for (Py_ssize_t i = 0; i < half; i++) {
      float a = x[i], b = x[i + half];
      y[i] = a * c[i] - b * sn[i];
      y[i + half] = b * c[i] + a * sn[i];
    }
  }
  for (Py_ssize_t i = 2 * half; i < h; i++) y[i] = x[i];
}

/* rotary(x, cos, sin, pos, out, (b, n, s, h, half, cache_rows, cb, pb), x_heads_first, out_heads_first,
 * interleaved) -> -1, or the flat index of the first position outside [0, cache_rows) (out then
 * unfinished). x, out float32 [b, n, s, h] (heads first) or [b, s, n, h] (a transposed view's
 * storage: the heads [b, n, s, h] the exporters' Transpose gives); cos, sin float32 [cache_rows, half]. With pos (int64
 * [pb, s], pb 1 or b) a row's cache row is its position; without (None), the caches are [cb, s, half]
 * (cb 1 or b: cache_rows = cb * s) and the row is (batch, step). */
static PyObject *rotary(PyObject *module, PyObject *args) {
  PyObject *o_x, *o_c, *o_s, *o_p, *o_o;
  Py_ssize_t b, n, s, h, half, cache_rows, cb, pb;
  int x_heads_first, out_heads_first, interleaved;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOOOO(nnnnnnnn)ppp", &o_x, &o_c, &o_s, &o_p, &o_o, &b, &n, &s, &h, &half, &cache_rows,
                        &cb, &pb, &x_heads_first, &out_heads_first, &interleaved))
    return NULL;
  int has_pos = o_p != Py_None;
  if (b < 1 || n < 1 || s < 1 || half < 0 || 2 * half > h || cache_rows < 1 || (has_pos && pb != 1 && pb != b) ||
      (!has_pos && ((cb != 1 && cb != b) || cache_rows != cb * s))) {
    PyErr_SetString(PyExc_ValueError, "rotary: dims must be positive, 2 * half <= h, pb (or cb) 1 or b, and "
                    "without positions cache_rows = cb * s");
    return NULL;
  }
  Py_buffer views[4], bp;
  PyObject *const objs[4] = {o_x, o_c, o_s, o_o};
  const char *const what[4] = {"rotary: x", "rotary: cos", "rotary: sin", "rotary: out"};
  const Py_ssize_t counts[4] = {b * n * s * h, cache_rows * half, cache_rows * half, b * n * s * h};
  if (get_buffers(3, views, objs, what, 4, "f", counts, 0) < 0) return NULL;
  if (get_buffer(o_o, &views[3], what[3], 4, "f", counts[3], 1) < 0) {
    release_buffers(3, views);
    return NULL;
  }
  if (has_pos && get_buffer(o_p, &bp, "rotary: pos", 8, "qlL", pb * s, 0) < 0) {
    release_buffers(4, views);
    return NULL;
  }
  const float *x = views[0].buf, *c = views[1].buf, *sn = views[2].buf;
  float *y = views[3].buf;
  const int64_t *pos = has_pos ? bp.buf : NULL;
  Py_ssize_t bad = -1;
  for (Py_ssize_t bi = 0; bi < b && bad < 0; bi++)
    for (Py_ssize_t si = 0; si < s; si++) {
      Py_ssize_t row;
      if (pos) {
        Py_ssize_t at = (pb > 1 ? bi : 0) * s + si;
        int64_t p = pos[at];
        if (p < 0 || p >= cache_rows) {
          bad = at;
          break;
        }
        row = (Py_ssize_t)p;
      } else {
        row = (cb > 1 ? bi : 0) * s + si;
      }
      for (Py_ssize_t ni = 0; ni < n; ni++) {
        Py_ssize_t heads = ((bi * n + ni) * s + si) * h, steps = ((bi * s + si) * n + ni) * h;
        rotary_row(x + (x_heads_first ? heads : steps), y + (out_heads_first ? heads : steps), c + row * half,
                   sn + row * half, h, half, interleaved);
      }
    }
  if (has_pos) PyBuffer_Release(&bp);
  release_buffers(4, views);
  return PyLong_FromSsize_t(bad);
}
/* ---- end of rotary embedding ---- */

/* ---- log-sum-exp over rows (reduction.py's LOGSUMEXP_PATHS["native_rows"]) ---- */
/* logsumexp_rows(x, y, n) -> bool: y[r] = log(sum(exp(x[r] - m))) + m over rows of n float32
 * values, m the row's maximum: x - m in float, exp as softmax_rows (exp_nonpositive), the sum, log
 * and + m in double, rounded once to float; False, y partly written, where a row holds a NaN or
 * +inf or is -inf throughout (the caller runs the numpy form). */
static PyObject *logsumexp_rows(PyObject *module, PyObject *args) {
  PyObject *o_x, *o_y;
  Py_ssize_t n;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOn", &o_x, &o_y, &n)) return NULL;
  if (n < 1) {
    PyErr_SetString(PyExc_ValueError, "logsumexp_rows: n must be at least 1");
    return NULL;
  }
  Py_buffer bx, by;
  if (get_buffer(o_x, &bx, "logsumexp_rows: x", 4, "f", -1, 0) < 0) return NULL;
  Py_ssize_t rows = bx.len / 4 / n;
  if ((bx.len / 4) % n || get_buffer(o_y, &by, "logsumexp_rows: y", 4, "f", rows, 1) < 0) {
    if ((bx.len / 4) % n) PyErr_SetString(PyExc_ValueError, "logsumexp_rows: n must divide x's size");
    PyBuffer_Release(&bx);
    return NULL;
  }
  const float *x = bx.buf;
  float *y = by.buf;
  int done = 1;
  for (Py_ssize_t r = 0; r < rows && done; r++) {
    const float *xr = x + r * n;
    float m = xr[0];
    int bad = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
      m = xr[i] > m ? xr[i] : m;
      bad |= (xr[i] != xr[i]) | (xr[i] > FLT_MAX);
    }
    if (bad || m < -FLT_MAX) {
      done = 0;
      break;
    }
    double sum = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) sum += exp_nonpositive(xr[i] - m);
    y[r] = (float)(log(sum) + (double)m);
  }
  PyBuffer_Release(&bx);
  PyBuffer_Release(&by);
  return PyBool_FromLong(done);
}
/* ---- end of log-sum-exp over rows ---- */


/* ---- Gelu (numerics.py's FAST_PATHS["gelu_native"]) ----
 * gelu_polynomial_inplace's float32 operations in its order, one pass: a = min(|x|, 15), q =
 * Horner of GELU_Q in a, q^16 by four squarings, y = max(x, 0) - a / q; NaN stays NaN. The
 * coefficients are numerics.GELU_Q rounded to float32, as numpy rounds them against a float32 array. */
static VECTOR_CLONES void gelu_floats(float *RESTRICT y, Py_ssize_t n, const float *RESTRICT c) {
  for (Py_ssize_t i = 0; i < n; i++) {
    float x = y[i];
    float a = fabsf(x);
    a = a > 15.0f ? 15.0f : a;
    float q = a * c[7];
    for (int k = 6; k > 0; k--) q = (q + c[k]) * a;
    q = q + c[0];
    q = q * q;
    q = q * q;
    q = q * q;
    q = q * q;
    float r = x > 0.0f ? x : 0.0f; /* -0.0 gives +0.0, as np.maximum's tie gives its bound */
    r = x != x ? x : r;
    y[i] = r - a / q;
  }
}

/* gelu(y, coefficients): y = gelu(y) in place (float32, C-contiguous), coefficients float32 [8]. */
static PyObject *gelu(PyObject *module, PyObject *args) {
  PyObject *o_y, *o_c;
  (void)module;
  if (!PyArg_ParseTuple(args, "OO", &o_y, &o_c)) return NULL;
  Py_buffer by, bc;
  if (get_buffer(o_c, &bc, "gelu: coefficients", 4, "f", 8, 0) < 0) return NULL;
  if (get_buffer(o_y, &by, "gelu: y", 4, "f", -1, 1) < 0) {
    PyBuffer_Release(&bc);
    return NULL;
  }
  gelu_floats(by.buf, by.len / 4, bc.buf);
  PyBuffer_Release(&by);
  PyBuffer_Release(&bc);
  Py_RETURN_NONE;
}
/* ---- end of Gelu ---- */

/* ---- ScatterElements / ScatterND (float32) ---- */
/* One update into v by reduction r (0 none, 1 add, 2 mul, 3 max, 4 min) in onnxruntime's order:
 * max is (u < v) ? v : u, min (v < u) ? v : u, so a NaN update propagates and a NaN already in
 * the data is replaced, as scatter.py's canonical form does. */
static inline void scatter_one(float *v, float u, int r) {
  switch (r) {
    case 0: *v = u; break;
    case 1: *v += u; break;
    case 2: *v *= u; break;
    case 3: if (!(u < *v)) *v = u; break;
    default: if (!(*v < u)) *v = u; break;
  }
}

/* scatter_elements(out, idx, upd, outer, length, rows, inner, reduction) -> -1, or the flat
 * position in idx of the first index outside [-length, length) (out is then partly written: the
 * caller discards it). out float32 [outer, length, inner] (C order, written in place), idx int64
 * and upd float32 [outer, rows, inner]: indices along the middle axis, in C order. */
static PyObject *scatter_elements(PyObject *module, PyObject *args) {
  PyObject *o_out, *o_idx, *o_upd;
  Py_ssize_t outer, length, rows, inner;
  int r;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOOnnnni", &o_out, &o_idx, &o_upd, &outer, &length, &rows, &inner, &r)) return NULL;
  Py_buffer bo, bi, bu;
  if (get_buffer(o_out, &bo, "scatter_elements: out", 4, "f", outer * length * inner, 1) < 0) return NULL;
  if (get_buffer(o_idx, &bi, "scatter_elements: indices", 8, "qlL", outer * rows * inner, 0) < 0) {
    PyBuffer_Release(&bo);
    return NULL;
  }
  if (get_buffer(o_upd, &bu, "scatter_elements: updates", 4, "f", outer * rows * inner, 0) < 0) {
    PyBuffer_Release(&bo);
    PyBuffer_Release(&bi);
    return NULL;
  }
  float *out = bo.buf;
  const long long *idx = bi.buf;
  const float *upd = bu.buf;
  Py_ssize_t bad = -1;
  for (Py_ssize_t o = 0; o < outer && bad < 0; o++) {
    for (Py_ssize_t i = 0; i < rows && bad < 0; i++) {
      Py_ssize_t at = (o * rows + i) * inner;
      for (Py_ssize_t j = 0; j < inner; j++) {
        long long k = idx[at + j];
        if (k < -length || k >= length) {
          bad = at + j;
          break;
        }
        if (k < 0) k += length;
        scatter_one(out + (o * length + k) * inner + j, upd[at + j], r);
      }
    }
  }
  PyBuffer_Release(&bo);
  PyBuffer_Release(&bi);
  PyBuffer_Release(&bu);
  return PyLong_FromSsize_t(bad);
}

/* scatter_nd(out, idx, upd, dims, inner, reduction) -> -1, or the first row of idx with an index
 * outside its axis's [-dim, dim). out float32 (C order, written in place), idx int64 [rows, k],
 * dims int64 [k]: the lengths of out's first k axes, upd float32 [rows, inner]: one slice of inner
 * values per row, rows in order. */
static PyObject *scatter_nd(PyObject *module, PyObject *args) {
  PyObject *o_out, *o_idx, *o_upd, *o_dims;
  Py_ssize_t inner;
  int r;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOOOni", &o_out, &o_idx, &o_upd, &o_dims, &inner, &r)) return NULL;
  Py_buffer bo, bi, bu, bd;
  if (get_buffer(o_dims, &bd, "scatter_nd: dims", 8, "qlL", -1, 0) < 0) return NULL;
  Py_ssize_t k = bd.len / 8;
  const long long *dims = bd.buf;
  Py_ssize_t slices = 1;
  for (Py_ssize_t c = 0; c < k; c++) slices *= dims[c];
  if (k < 1 || get_buffer(o_out, &bo, "scatter_nd: out", 4, "f", slices * inner, 1) < 0) {
    if (k < 1) PyErr_SetString(PyExc_ValueError, "scatter_nd: no indexed axis");
    PyBuffer_Release(&bd);
    return NULL;
  }
  if (get_buffer(o_idx, &bi, "scatter_nd: indices", 8, "qlL", -1, 0) < 0) {
    PyBuffer_Release(&bd);
    PyBuffer_Release(&bo);
    return NULL;
  }
  Py_ssize_t rows = bi.len / 8 / k;
  if (get_buffer(o_upd, &bu, "scatter_nd: updates", 4, "f", rows * inner, 0) < 0) {
    PyBuffer_Release(&bd);
    PyBuffer_Release(&bo);
    PyBuffer_Release(&bi);
    return NULL;
  }
  float *out = bo.buf;
  const long long *idx = bi.buf;
  const float *upd = bu.buf;
  Py_ssize_t bad = -1;
  for (Py_ssize_t i = 0; i < rows && bad < 0; i++) {
    Py_ssize_t at = 0;
    for (Py_ssize_t c = 0; c < k; c++) {
      long long v = idx[i * k + c];
      if (v < -dims[c] || v >= dims[c]) {
        bad = i;
        break;
      }
      at = at * dims[c] + (v < 0 ? v + dims[c] : v);
    }
    if (bad >= 0) break;
    float *dst = out + at * inner;
    const float *src = upd + i * inner;
    for (Py_ssize_t j = 0; j < inner; j++) scatter_one(dst + j, src[j], r);
  }
  PyBuffer_Release(&bd);
  PyBuffer_Release(&bo);
  PyBuffer_Release(&bi);
  PyBuffer_Release(&bu);
  return PyLong_FromSsize_t(bad);
}
/* ---- end of ScatterElements / ScatterND ---- */

/* ---- NonMaxSuppression ---- */
/* numpy's minimum and maximum: a NaN operand is the result (C's fmin/fmax drop it). */
static inline double np_min(double a, double b) { return a != a ? a : (b != b ? b : (a < b ? a : b)); }
static inline double np_max(double a, double b) { return a != a ? a : (b != b ? b : (a > b ? a : b)); }

/* IoU of boxes r and c of corners [5][n] (y1, x1, y2, x2, area), in detection.iou's float64 steps
 * and order: this translation unit is built without FMA contraction (no target attribute here), so
 * the result is numpy's to the bit. */
static inline double nms_iou(const double *cr, Py_ssize_t n, Py_ssize_t r, Py_ssize_t c) {
  const double *y1 = cr, *x1 = cr + n, *y2 = cr + 2 * n, *x2 = cr + 3 * n, *area = cr + 4 * n;
  double ih = np_min(y2[r], y2[c]) - np_max(y1[r], y1[c]);
  double iw = np_min(x2[r], x2[c]) - np_max(x1[r], x1[c]);
  double inter = np_max(ih, 0.0) * np_max(iw, 0.0);
  double uni = area[r] + area[c] - inter;
  int valid = area[r] > 0 && area[c] > 0 && uni > 0;
  return valid ? inter / uni : 0.0;
}

/* nms_keep(corners, order, kept, count, iou_max, limit) -> count: greedy suppression of the boxes of
 * order (int64, best first) over corners (float64 [5, n]), after the count boxes already in kept
 * (int64, room for count + len(order)); the boxes kept are appended there, until limit in all. */
static PyObject *nms_keep(PyObject *module, PyObject *args) {
  PyObject *o_c, *o_o, *o_k;
  Py_ssize_t count;
  double iou_max;
  long long limit;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOOndL", &o_c, &o_o, &o_k, &count, &iou_max, &limit)) return NULL;
  Py_buffer bc, bo, bk;
  if (get_buffer(o_c, &bc, "nms_keep: corners", 8, "d", -1, 0) < 0) return NULL;
  if (get_buffer(o_o, &bo, "nms_keep: order", 8, "lq", -1, 0) < 0) {
    PyBuffer_Release(&bc);
    return NULL;
  }
  if (get_buffer(o_k, &bk, "nms_keep: kept", 8, "lq", -1, 1) < 0) {
    PyBuffer_Release(&bc);
    PyBuffer_Release(&bo);
    return NULL;
  }
  Py_ssize_t n = bc.len / 8 / 5, m = bo.len / 8;
  const long long *order = bo.buf;
  long long *kept = bk.buf;
  int bad = bc.len != n * 5 * 8 || count < 0 || bk.len / 8 < count + m;
  for (Py_ssize_t i = 0; i < m && !bad; i++) bad = order[i] < 0 || order[i] >= n;
  for (Py_ssize_t j = 0; j < count && !bad; j++) bad = kept[j] < 0 || kept[j] >= n;
  if (bad) {
    PyBuffer_Release(&bc);
    PyBuffer_Release(&bo);
    PyBuffer_Release(&bk);
    PyErr_SetString(PyExc_ValueError, "nms_keep: corners must be [5, n], the indices within n and kept hold "
                                      "count + len(order) values");
    return NULL;
  }
  Py_BEGIN_ALLOW_THREADS
  for (Py_ssize_t i = 0; i < m && count < limit; i++) {
    Py_ssize_t c = (Py_ssize_t)order[i];
    int suppressed = 0;
    for (Py_ssize_t j = 0; j < count && !suppressed; j++) suppressed = nms_iou(bc.buf, n, (Py_ssize_t)kept[j], c) > iou_max;
    if (!suppressed) kept[count++] = c;
  }
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&bc);
  PyBuffer_Release(&bo);
  PyBuffer_Release(&bk);
  return PyLong_FromSsize_t(count);
}
/* ---- end of NonMaxSuppression ---- */

/* ---- Resize over the last two axes (float32) ---- */
/* resize_last_two(out, x, planes, in_h, in_w, out_h, out_w, idx, w, lerp_rows, lerp_cols): out
 * float32 [planes, out_h, out_w] (written), x float32 [planes, in_h, in_w]; idx int64 [2 out_h +
 * 2 out_w]: the rows' first and second taps, then the columns'; w float32 [out_h + out_w]: the
 * second tap's weight per row, then per column. An axis with lerp 0 copies its first tap (nearest
 * mode, or an axis left as it is); with lerp 1 it is a + (b - a) w in float32, rows first, then
 * columns: resize.py's resize_axes in the same order, so the same bits (no contraction into FMA). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
static void resize_plane(float *out, const float *x, float *row, Py_ssize_t in_w, Py_ssize_t out_h, Py_ssize_t out_w,
                         const long long *idx, const float *w, int lerp_rows, int lerp_cols) {
  const long long *r0 = idx, *r1 = idx + out_h, *c0 = idx + 2 * out_h, *c1 = c0 + out_w;
  const float *wr = w, *wc = w + out_h;
  for (Py_ssize_t i = 0; i < out_h; i++, out += out_w) {
    const float *a = x + r0[i] * in_w;
    if (lerp_rows) {
      const float *b = x + r1[i] * in_w;
      float t = wr[i];
      for (Py_ssize_t k = 0; k < in_w; k++) row[k] = a[k] + (b[k] - a[k]) * t;
      a = row;
    }
    if (lerp_cols) {
      for (Py_ssize_t j = 0; j < out_w; j++) {
        float u = a[c0[j]];
        out[j] = u + (a[c1[j]] - u) * wc[j];
      }
    } else {
      for (Py_ssize_t j = 0; j < out_w; j++) out[j] = a[c0[j]];
    }
  }
}

static PyObject *resize_last_two(PyObject *module, PyObject *args) {
  PyObject *o_out, *o_x, *o_idx, *o_w;
  Py_ssize_t planes, in_h, in_w, out_h, out_w;
  int lerp_rows, lerp_cols;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOnnnnnOOii", &o_out, &o_x, &planes, &in_h, &in_w, &out_h, &out_w, &o_idx, &o_w,
                        &lerp_rows, &lerp_cols))
    return NULL;
  if (planes < 0 || in_h < 1 || in_w < 1 || out_h < 0 || out_w < 0) {
    PyErr_SetString(PyExc_ValueError, "resize_last_two: lengths must be positive");
    return NULL;
  }
  Py_buffer bo, bx, bi, bw;
  if (get_buffer(o_out, &bo, "resize_last_two: out", 4, "f", planes * out_h * out_w, 1) < 0) return NULL;
  if (get_buffer(o_x, &bx, "resize_last_two: x", 4, "f", planes * in_h * in_w, 0) < 0) {
    PyBuffer_Release(&bo);
    return NULL;
  }
  if (get_buffer(o_idx, &bi, "resize_last_two: idx", 8, "qlL", 2 * (out_h + out_w), 0) < 0) {
    PyBuffer_Release(&bo);
    PyBuffer_Release(&bx);
    return NULL;
  }
  if (get_buffer(o_w, &bw, "resize_last_two: w", 4, "f", out_h + out_w, 0) < 0) {
    PyBuffer_Release(&bo);
    PyBuffer_Release(&bx);
    PyBuffer_Release(&bi);
    return NULL;
  }
  const long long *idx = bi.buf;
  int bad = 0;
  for (Py_ssize_t k = 0; k < 2 * out_h && !bad; k++) bad = idx[k] < 0 || idx[k] >= in_h;
  for (Py_ssize_t k = 2 * out_h; k < 2 * (out_h + out_w) && !bad; k++) bad = idx[k] < 0 || idx[k] >= in_w;
  float *row = bad ? NULL : PyMem_Malloc((size_t)in_w * sizeof(float));
  if (!bad && row) {
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t p = 0; p < planes; p++)
      resize_plane((float *)bo.buf + p * out_h * out_w, (const float *)bx.buf + p * in_h * in_w, row, in_w, out_h,
                   out_w, idx, bw.buf, lerp_rows, lerp_cols);
    Py_END_ALLOW_THREADS
  }
  PyMem_Free(row);
  PyBuffer_Release(&bo);
  PyBuffer_Release(&bx);
  PyBuffer_Release(&bi);
  PyBuffer_Release(&bw);
  if (bad) {
    PyErr_SetString(PyExc_ValueError, "resize_last_two: a tap index lies outside the input");
    return NULL;
  }
  if (!row) return PyErr_NoMemory();
  Py_RETURN_NONE;
}
/* ---- end of Resize ---- */

/* ---- GridSample ---- */
/* grid_sample_linear(out, x, grid, n, c, h, w, gh, gw, align, padding) -> bool: bilinear GridSample of
 * x float32 [n, c, h, w] at grid float32 [n, gh, gw, 2] (x, y) into out float32 [n, c, gh, gw];
 * padding 0 zeros, 1 border, 2 reflection. grid_sample.py's numpy form step for step: each
 * coordinate unnormalized in double, rounded to float then widened, padded in double (reflection
 * as its reflect_folded: the offset from the low border modulo twice the range, numpy's floored
 * modulo), floor and fraction in double, each corner's index padded (reflected again, truncated,
 * clamped) and its weight wy * wx in double (times 0 outside, zeros padding) rounded to float; the
 * four products summed from 0.0f in float, corners (y0 x0, y0 x1, y1 x0, y1 x1): the same bits.
 * False (out partly written) where a coordinate is not finite or beyond +-2^40, which the numpy form
 * then handles. */
/* reflect_folded of c into [lo, lo + rng] (rng > 0): numpy's floored modulo of the offset by twice
 * the range, mirrored above the range. fmod is exact, so an offset within one period either way
 * skips it with the same result. */
static inline double grid_reflect(double c, double lo, double rng) {
  double x = c - lo, period = 2 * rng, t;
  if (x >= 0 && x < period) {
    t = x;
  } else if (x < 0 && x > -period) {
    t = x + period;
  } else {
    t = fmod(x, period);
    if (t < 0) t += period;
  }
  return lo + (t > rng ? period - t : t);
}

#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
static int grid_corners(const float *g, Py_ssize_t points, Py_ssize_t h, Py_ssize_t w, int align, int padding,
                        Py_ssize_t *idx, float *wt) {
  const Py_ssize_t dims[2] = {h, w};
  for (Py_ssize_t p = 0; p < points; p++) {
    Py_ssize_t k[2][2];
    double side_w[2][2], ok[2][2];
    for (int a = 0; a < 2; a++) { /* a 0: y (grid's second value), 1: x */
      double d = (double)dims[a], gv = (double)g[2 * p + 1 - a];
      double c = align ? (gv + 1) / 2.0 * (d - 1) : ((gv + 1) * d - 1) / 2.0;
      c = (double)(float)c;
      double lo = align ? 0.0 : -0.5, hi = align ? d - 1.0 : d - 0.5, rng = hi - lo;
      if (!isfinite(c)) return 0;
      if (padding == 1) {
        if (c < lo || c > hi) c = c < 0 ? 0 : (c > d - 1 ? d - 1 : c);
      } else if (padding == 2) {
        c = rng <= 0 ? lo : grid_reflect(c, lo, rng);
      }
      if (c < -1099511627776.0 || c > 1099511627776.0) return 0;
      double f = floor(c), frac = c - f;
      side_w[a][0] = 1.0 - frac;
      side_w[a][1] = frac;
      for (int s = 0; s < 2; s++) {
        double i = f + s;
        ok[a][s] = 1.0;
        if (padding == 0) {
          ok[a][s] = i >= 0 && i < d;
        } else if (padding == 2) {
          i = trunc(rng <= 0 ? lo : grid_reflect(i, lo, rng));
        }
        k[a][s] = (Py_ssize_t)(i < 0 ? 0 : (i > d - 1 ? d - 1 : i));
      }
    }
    for (int cy = 0; cy < 2; cy++)
      for (int cx = 0; cx < 2; cx++) {
        double wv = side_w[0][cy] * side_w[1][cx];
        if (padding == 0) wv = wv * (ok[0][cy] * ok[1][cx]);
        idx[4 * p + 2 * cy + cx] = k[0][cy] * w + k[1][cx];
        wt[4 * p + 2 * cy + cx] = (float)wv;
      }
  }
  return 1;
}

#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
static void grid_plane(float *out, const float *x, Py_ssize_t points, const Py_ssize_t *idx, const float *wt) {
  for (Py_ssize_t p = 0; p < points; p++) {
    const Py_ssize_t *i = idx + 4 * p;
    const float *v = wt + 4 * p;
    float acc = 0.0f;
    acc = acc + x[i[0]] * v[0];
    acc = acc + x[i[1]] * v[1];
    acc = acc + x[i[2]] * v[2];
    acc = acc + x[i[3]] * v[3];
    out[p] = acc;
  }
}

static PyObject *grid_sample_linear(PyObject *module, PyObject *args) {
  PyObject *o_out, *o_x, *o_grid;
  Py_ssize_t n, c, h, w, gh, gw;
  int align, padding;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOOnnnnnnii", &o_out, &o_x, &o_grid, &n, &c, &h, &w, &gh, &gw, &align, &padding))
    return NULL;
  if (n < 0 || c < 0 || h < 1 || w < 1 || gh < 0 || gw < 0 || padding < 0 || padding > 2) {
    PyErr_SetString(PyExc_ValueError, "grid_sample_linear: lengths must be positive, padding 0, 1 or 2");
    return NULL;
  }
  Py_buffer buf[3]; /* out, x, grid */
  Py_ssize_t points = gh * gw;
  if (get_buffers(3, buf, (PyObject *[]){o_out, o_x, o_grid},
                  (const char *[]){"grid_sample_linear: out", "grid_sample_linear: x", "grid_sample_linear: grid"}, 4,
                  "f", (Py_ssize_t[]){n * c * points, n * c * h * w, n * points * 2}, 1) < 0)
    return NULL;
  Py_ssize_t *idx = PyMem_Malloc((size_t)(4 * points + 1) * sizeof(Py_ssize_t));
  float *wt = PyMem_Malloc((size_t)(4 * points + 1) * sizeof(float));
  int done = 1;
  if (idx && wt) {
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < n && done; b++) {
      done = grid_corners((const float *)buf[2].buf + b * points * 2, points, h, w, align, padding, idx, wt);
      for (Py_ssize_t ch = 0; ch < c && done; ch++)
        grid_plane((float *)buf[0].buf + (b * c + ch) * points, (const float *)buf[1].buf + (b * c + ch) * h * w, points,
                   idx, wt);
    }
    Py_END_ALLOW_THREADS
  }
  int failed = !idx || !wt;
  PyMem_Free(idx);
  PyMem_Free(wt);
  release_buffers(3, buf);
  if (failed) return PyErr_NoMemory();
  return PyBool_FromLong(done);
}
/* ---- end of GridSample ---- */

/* ---- Tree ensemble build (ml_trees.TREE_BUILD_PATHS["native"]) ---- */
/* The tables ml_trees._links and _tree_shape make a few numpy calls per tree level and per lookup
 * for, in one pass over the nodes: a forest's creation was then mostly those calls' fixed cost
 * (about 100 us a small tree). Same results as the numpy build, to the index (tests/test_tree_build_native.py). */
typedef struct {
  int64_t tree, id, pos;
} NodeKey;

static int node_key_order(const void *a, const void *b) {
  const NodeKey *x = a, *y = b;
  if (x->tree != y->tree) return x->tree < y->tree ? -1 : 1;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* The position of (tree, id) among the sorted keys, the last of equal pairs (the last position
 * given), or -1. */
static int64_t node_find(const NodeKey *key, Py_ssize_t n, int64_t tree, int64_t id) {
  Py_ssize_t lo = 0, hi = n; /* the first key greater than (tree, id) */
  while (lo < hi) {
    Py_ssize_t mid = lo + (hi - lo) / 2;
    if (key[mid].tree < tree || (key[mid].tree == tree && key[mid].id <= id)) lo = mid + 1;
    else hi = mid;
  }
  return lo > 0 && key[lo - 1].tree == tree && key[lo - 1].id == id ? key[lo - 1].pos : -1;
}

/* (tree id, node id) pairs to node positions: where the nodes come tree by tree in ascending
 * tree id with each tree's ids 0, 1, ... (as converters write them: ml_trees._NodeIndex._dense) a
 * pair's position is its tree's start plus its id, found among the tree ids alone; else the pairs
 * sorted (NodeKey) and searched. */
typedef struct {
  int dense;
  Py_ssize_t n, trees;
  const NodeKey *key;
  const int64_t *tree_value, *tree_start; /* dense: [trees], [trees + 1] */
} NodeIndex;

static int64_t index_find(const NodeIndex *ix, int64_t tree, int64_t id) {
  if (!ix->dense) return node_find(ix->key, ix->n, tree, id);
  Py_ssize_t lo = 0, hi = ix->trees;
  while (lo < hi) {
    Py_ssize_t mid = lo + (hi - lo) / 2;
    if (ix->tree_value[mid] < tree) lo = mid + 1;
    else hi = mid;
  }
  if (lo == ix->trees || ix->tree_value[lo] != tree || id < 0 || id >= ix->tree_start[lo + 1] - ix->tree_start[lo])
    return -1;
  return ix->tree_start[lo] + id;
}

/* The walk of _tree_shape from roots[0..r): per node its tree's slot (owner), leaf count and the
 * number of its first leaf in its tree, the visited nodes level by level, per tree its longest
 * walk. Returns the nodes visited, or -1 where a node is reached twice (a shared node or a cycle);
 * work arrays frontier and slots hold 2n entries each. */
static Py_ssize_t forest_shape(Py_ssize_t n, const uint8_t *leaf, const int64_t *tnext, const int64_t *fnext,
                               const int64_t *roots, Py_ssize_t r, int64_t *owner, int64_t *count, int64_t *first,
                               int64_t *visited, int64_t *tree_depth, int64_t *level_start, uint8_t *seen) {
  Py_ssize_t done = 0, levels = 0;
  for (Py_ssize_t k = 0; k < n; k++) {
    owner[k] = -1;
    count[k] = leaf[k] ? 1 : 0;
    first[k] = 0;
    seen[k] = 0;
  }
  for (Py_ssize_t t = 0; t < r; t++) tree_depth[t] = 0;
  if (r > n) return -1;
  /* level 0: the roots, slot t; a level's children go true ones first, then false ones, as
   * _tree_shape's concatenation; visited[] is the frontier of each level in turn */
  for (Py_ssize_t t = 0; t < r; t++) {
    visited[t] = roots[t];
    owner[roots[t]] = t; /* a node reached twice is refused below, before owner is read */
  }
  Py_ssize_t begin = 0, end = r;
  done = r;
  while (begin < end) {
    level_start[levels++] = begin;
    Py_ssize_t inner = 0;
    for (Py_ssize_t i = begin; i < end; i++) inner += !leaf[visited[i]];
    if (done + 2 * inner > n) return -1; /* more visits than nodes: a node shared, or a cycle */
    Py_ssize_t at = end;
    for (int side = 0; side < 2; side++)
      for (Py_ssize_t i = begin; i < end; i++) {
        int64_t v = visited[i];
        if (leaf[v]) continue;
        visited[at++] = side ? fnext[v] : tnext[v];
      }
    for (Py_ssize_t i = begin; i < end; i++) {
      int64_t v = visited[i];
      if (!leaf[v] && tree_depth[owner[v]] < levels) tree_depth[owner[v]] = levels;
    }
    /* the children's slots: their parent's (read before a node reached twice is refused: the
     * slots of such a walk are never returned) */
    Py_ssize_t c = end;
    for (int side = 0; side < 2; side++)
      for (Py_ssize_t i = begin; i < end; i++) {
        int64_t v = visited[i];
        if (leaf[v]) continue;
        owner[visited[c++]] = owner[v];
      }
    begin = end;
    end = at;
    done = at;
  }
  level_start[levels] = done;
  for (Py_ssize_t i = 0; i < done; i++) {
    if (seen[visited[i]]) return -1;
    seen[visited[i]] = 1;
  }
  for (Py_ssize_t l = levels - 1; l >= 0; l--)
    for (Py_ssize_t i = level_start[l]; i < level_start[l + 1]; i++) {
      int64_t v = visited[i];
      if (!leaf[v]) count[v] = count[tnext[v]] + count[fnext[v]];
    }
  for (Py_ssize_t i = 0; i < done; i++) {
    int64_t v = visited[i];
    if (leaf[v]) continue;
    first[tnext[v]] = first[v];
    first[fnext[v]] = first[v] + count[tnext[v]];
  }
  return done;
}

/* forest_build(trees, ids, leaf, true_ids, false_ids, leaf_trees, leaf_ids, true_next, false_next, roots,
 *              leaf_at, owner, count, first, visited, tree_depth) -> (status, a, b)
 * In: int64 [n] trees, ids, true_ids, false_ids (read at interior nodes), bool [n] leaf, int64 [m]
 * leaf_trees, leaf_ids. Out (int64, written): [n] true_next, false_next (a leaf's: itself), roots
 * (per tree id ascending its first node no interior node names as child; the first a used),
 * [m] leaf_at (each (tree, id) pair's node position, the last one given, or -1), and where the
 * trees share no node [n] owner, count, first, visited (the first b used), tree_depth (a used).
 * status 0: (0, roots a, visited b, or -1 where a node is reached twice); 1: (1, node k, child id)
 * an interior node k names a child no node is (the first such node); nothing else is written then. */
static PyObject *forest_build(PyObject *module, PyObject *args) {
  PyObject *o[16];
  (void)module;
  if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8],
                        &o[9], &o[10], &o[11], &o[12], &o[13], &o[14], &o[15]))
    return NULL;
  static const char *what[16] = {"trees", "ids", "leaf", "true_ids", "false_ids", "leaf_trees", "leaf_ids",
                                 "true_next", "false_next", "roots", "leaf_at", "owner", "count", "first",
                                 "visited", "tree_depth"};
  Py_buffer b[16];
  int held = 0;
  PyObject *result = NULL;
  NodeKey *key = NULL;
  int64_t *work = NULL;
  uint8_t *flags = NULL;
  Py_ssize_t n = -1, m = -1;
  for (; held < 16; held++) {
    int is_leaf = held == 2, in_m = held == 5 || held == 6 || held == 10;
    Py_ssize_t count = held == 0 ? -1 : in_m ? (held == 5 ? -1 : m) : n;
    if (get_buffer(o[held], &b[held], what[held], is_leaf ? 1 : 8, is_leaf ? "?bB" : "lq", count, held >= 7) < 0)
      goto done;
    if (held == 0) n = b[0].len / 8;
    if (held == 5) m = b[5].len / 8;
  }
  const int64_t *trees = b[0].buf, *ids = b[1].buf, *tid = b[3].buf, *fid = b[4].buf;
  const int64_t *ltrees = b[5].buf, *lids = b[6].buf;
  const uint8_t *leaf = b[2].buf;
  int64_t *tnext = b[7].buf, *fnext = b[8].buf, *roots = b[9].buf, *leaf_at = b[10].buf;
  key = PyMem_Malloc((n ? n : 1) * sizeof(NodeKey));
  work = PyMem_Malloc((3 * n + 3) * sizeof(int64_t));
  flags = PyMem_Malloc(n ? 2 * n : 1);
  if (!key || !work || !flags) {
    PyErr_NoMemory();
    goto done;
  }
  /* work: [n + 2] level starts of the walk; before it, the dense index's tree values and starts */
  int64_t *tree_value = work + n + 2, *tree_start = work + 2 * n + 2;
  NodeIndex ix = {1, n, 0, key, tree_value, tree_start};
  for (Py_ssize_t k = 0; k < n && ix.dense; k++) {
    if (k == 0 || trees[k] != trees[k - 1]) {
      if (k > 0 && trees[k] < trees[k - 1]) ix.dense = 0;
      tree_value[ix.trees] = trees[k];
      tree_start[ix.trees++] = k;
    }
    if (ids[k] != k - tree_start[ix.trees - 1]) ix.dense = 0;
  }
  tree_start[ix.trees] = n;
  if (!ix.dense) {
    for (Py_ssize_t k = 0; k < n; k++) key[k] = (NodeKey){trees[k], ids[k], k};
    qsort(key, n, sizeof(NodeKey), node_key_order);
  }
  uint8_t *child = flags;
  memset(child, 0, n);
  for (Py_ssize_t k = 0; k < n; k++) {
    tnext[k] = fnext[k] = k;
    if (leaf[k]) continue;
    int64_t t = index_find(&ix, trees[k], tid[k]), f = index_find(&ix, trees[k], fid[k]);
    if (t < 0 || f < 0) {
      result = Py_BuildValue("(inL)", 1, k, (long long)(t < 0 ? tid[k] : fid[k]));
      goto done;
    }
    tnext[k] = t;
    fnext[k] = f;
    child[t] = child[f] = 1;
  }
  for (Py_ssize_t j = 0; j < m; j++) leaf_at[j] = index_find(&ix, ltrees[j], lids[j]);
  /* roots: per tree id ascending its first free node; the tree ids are in order where the index
   * is dense, else the free nodes as (tree, 0, position) sorted (the keys are no longer read) */
  Py_ssize_t free_count = 0, r = 0;
  if (ix.dense) {
    for (Py_ssize_t k = 0; k < n; k++)
      if (!child[k] && (r == 0 || trees[roots[r - 1]] != trees[k])) roots[r++] = k;
  } else {
    NodeKey *spare = (NodeKey *)key;
    for (Py_ssize_t k = 0; k < n; k++)
      if (!child[k]) spare[free_count++] = (NodeKey){trees[k], 0, k};
    qsort(spare, free_count, sizeof(NodeKey), node_key_order);
    for (Py_ssize_t i = 0; i < free_count; i++)
      if (i == 0 || spare[i].tree != spare[i - 1].tree) roots[r++] = spare[i].pos;
  }
  Py_ssize_t visited = r ? forest_shape(n, leaf, tnext, fnext, roots, r, b[11].buf, b[12].buf, b[13].buf,
                                        b[14].buf, b[15].buf, work, flags + n) : -1;
  result = Py_BuildValue("(inn)", 0, r, visited);
done:
  for (int i = 0; i < held; i++) PyBuffer_Release(&b[i]);
  PyMem_Free(key);
  PyMem_Free(work);
  PyMem_Free(flags);
  return result;
}
/* ---- end of the tree ensemble build ---- */

/* ---- elementwise chains: com.onnxhal ElementwiseChain (elementwise_chain.py) ----
 * elementwise_chain(code, inputs, out_regs, n_regs, empty): a program of elementwise ops over
 * registers, run over the outputs' shape a block of EC_BLOCK elements of its last axis at a time,
 * so every register of a block stays in L1 and the chain costs one call, not one numpy call (and
 * one executor step) per node. code: int32 records of EC_REC (op, dst, a, b, c), op k writing
 * register len(inputs) + k from registers written before it (a unary op's b and c are its a, a
 * binary op's c its b); registers 0..len(inputs)-1 hold the inputs broadcast to the outputs'
 * shape (numpy's rule; strides any). The float inputs are all float32 or all float64, the chain's
 * type T; an input of bool or a signed or unsigned integer type of up to 64 bits (not uint64) is read as T
 * (C's conversion, numpy's astype), and only by a Cast to T or as a Where's condition, which the
 * call checks (a bool is 0 or 1 in T, Where tests it against 0). The outputs (made by
 * empty(shape, dtype), C-contiguous) are the whole broadcast shape; out_regs: int32, the register
 * each is copied from. It declines (None: the caller's numpy form then raises or computes what
 * the nodes would) where the float inputs are not all float32 or all float64 (or there is none), a
 * Cast's type is not theirs, an integer input is read otherwise, the inputs do not broadcast, or an
 * output's own inputs broadcast to less than the whole shape (it would have a smaller one), or
 * past EC_LIBM_MAX elements where an op is left to libm, or past EC_SHORT_ROWS_MAX elements in
 * rows shorter than half a block (below), so
 * every shape check is one pass over the axes here, not Python's per call. A register holds T
 * throughout, as numpy's ops on the float inputs would. The ops are the numpy kernels' formulas:
 * Sigmoid as 0.5 tanh(x / 2) + 0.5 (activation.py), Max / Min propagate NaN as numpy's maximum /
 * minimum, Relu keeps NaN (numpy's maximum(x, 0)); libm's exp / log / tanh may differ from
 * numpy's by an ulp. */
enum { EC_ADD, EC_SUB, EC_MUL, EC_DIV, EC_MAX, EC_MIN, EC_NEG, EC_ABS, EC_SQRT, EC_EXP, EC_LOG, EC_TANH,
       EC_SIGMOID, EC_RELU, EC_RECIPROCAL, EC_CAST_FLOAT, EC_CAST_DOUBLE, EC_WHERE, EC_OPS };
#define EC_REC 5 /* int32s per op in the code */
#define EC_BLOCK 256
#define EC_MAX_REGS 128
#define EC_MAX_INPUTS 64 /* each output's inputs, a bit each of a uint64_t */
#define EC_MAX_DIMS 16
#define EC_LIBM_MAX 2048
#define EC_SHORT_ROWS_MAX 4096

/* exp of float as exp_nonpositive computes it (2^n exp(f), Taylor to f^7), for any input: +inf
 * above 88.72, 0 below -86.5 (numpy gives subnormals down to -103, all under 3e-38), NaN kept; one
 * loop the compiler vectorizes, where libm's expf is a call per element */
static inline ALWAYS_INLINE NO_TRAPPING_MATH void exp_floats(float *RESTRICT y, const float *RESTRICT x,
                                                             Py_ssize_t n) {
  const float magic = 12582912.0f;
  int32_t magic_bits;
  memcpy(&magic_bits, &magic, 4);
  for (Py_ssize_t i = 0; i < n; i++) {
    float z = x[i];
    float zc = z > -86.5f ? (z < 88.72283f ? z : 88.72283f) : -86.5f;
    float r = zc * 1.44269504088896341f + magic;
    int32_t rbits;
    memcpy(&rbits, &r, 4);
    int32_t ni = rbits - magic_bits;
    float nf = r - magic;
    float f = (zc - nf * 0.693145751953125f) - nf * 1.42860682030941723212e-6f;
    float p = 1.0f + f * (1.0f + f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120 + f * (1.0f / 720 +
              f * (1.0f / 5040)))))));
    int32_t sbits = (ni + 126) << 23; /* 2^(n - 1), times 2 after: 2^128 is no float */
    float scale;
    memcpy(&scale, &sbits, 4);
    float e = p * scale * 2.0f;
    e = z > 88.72283f ? INFINITY : e;
    e = z > -86.5f ? e : 0.0f;
    y[i] = z != z ? z : e;
  }
}

static inline void exp_doubles(double *RESTRICT y, const double *RESTRICT x, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; i++) y[i] = exp(x[i]);
}

/* TANHV: tanh in place over a block, tanh_floats' vectorized form for float (the LSTM steps'), libm's
 * for double; EXPV exp_floats / libm's; ec_ops built for AVX-512 and AVX2, so its loops are vectors */
#define EC_DEFINE(T, SFX, EXPV, LOG, TANHV, SQRT, FABS)                                                        \
  static VECTOR_CLONES void ec_ops_##SFX(const int32_t *code, Py_ssize_t n_ops, T *const *reg, Py_ssize_t n) { \
    for (Py_ssize_t k = 0; k < n_ops; k++) {                                                                   \
      const int32_t *q = code + EC_REC * k;                                                                    \
      T *y = reg[q[1]];                                                                                        \
      const T *a = reg[q[2]], *b = reg[q[3]], *c = reg[q[4]];                                                  \
      const T h = (T)0.5, one = (T)1, zero = (T)0;                                                             \
      switch (q[0]) {                                                                                          \
        case EC_ADD: for (Py_ssize_t i = 0; i < n; i++) y[i] = a[i] + b[i]; break;                             \
        case EC_SUB: for (Py_ssize_t i = 0; i < n; i++) y[i] = a[i] - b[i]; break;                             \
        case EC_MUL: for (Py_ssize_t i = 0; i < n; i++) y[i] = a[i] * b[i]; break;                             \
        case EC_DIV: for (Py_ssize_t i = 0; i < n; i++) y[i] = a[i] / b[i]; break;                             \
        case EC_MAX: for (Py_ssize_t i = 0; i < n; i++) y[i] = (a[i] != a[i] || a[i] >= b[i]) ? a[i] : b[i]; break; \
        case EC_MIN: for (Py_ssize_t i = 0; i < n; i++) y[i] = (a[i] != a[i] || a[i] <= b[i]) ? a[i] : b[i]; break; \
        case EC_NEG: for (Py_ssize_t i = 0; i < n; i++) y[i] = -a[i]; break;                                   \
        case EC_ABS: for (Py_ssize_t i = 0; i < n; i++) y[i] = FABS(a[i]); break;                              \
        case EC_SQRT: for (Py_ssize_t i = 0; i < n; i++) y[i] = SQRT(a[i]); break;                             \
        case EC_EXP: EXPV(y, a, n); break;                                                                     \
        case EC_LOG: for (Py_ssize_t i = 0; i < n; i++) y[i] = LOG(a[i]); break;                               \
        case EC_TANH:                                                                                          \
          memcpy(y, a, (size_t)n * sizeof(T));                                                                 \
          TANHV(y, n);                                                                                         \
          break;                                                                                               \
        case EC_SIGMOID:                                                                                       \
          for (Py_ssize_t i = 0; i < n; i++) y[i] = a[i] * h;                                                  \
          TANHV(y, n);                                                                                         \
          for (Py_ssize_t i = 0; i < n; i++) y[i] = y[i] * h + h;                                              \
          break;                                                                                               \
        case EC_RELU: for (Py_ssize_t i = 0; i < n; i++) y[i] = a[i] < zero ? zero : a[i]; break;              \
        case EC_RECIPROCAL: for (Py_ssize_t i = 0; i < n; i++) y[i] = one / a[i]; break;                       \
        /* a Cast to T: its source converted on loading (an integer input) or already T */                   \
        case EC_CAST_FLOAT: case EC_CAST_DOUBLE: memcpy(y, a, (size_t)n * sizeof(T)); break;                   \
        case EC_WHERE: for (Py_ssize_t i = 0; i < n; i++) y[i] = a[i] != zero ? b[i] : c[i]; break;           \
        default: break;                                                                                        \
      }                                                                                                        \
    }                                                                                                          \
  }                                                                                                            \
  /* n elements of an input at p, step bytes apart (0: one element repeated), as T: kind 0 an input \
   * of T, else its buffer format (ec_item's) */                                                             \
  static void ec_load_##SFX(T *RESTRICT y, const char *p, Py_ssize_t step, Py_ssize_t n, char kind) {          \
    switch (kind) {                                                                                            \
      case 0:                                                                                                  \
        if (step == (Py_ssize_t)sizeof(T)) memcpy(y, p, (size_t)n * sizeof(T));                                \
        else for (Py_ssize_t i = 0; i < n; i++) y[i] = *(const T *)(p + i * step);                             \
        break;                                                                                                 \
      case '?': case 'B': for (Py_ssize_t i = 0; i < n; i++) y[i] = (T)*(const uint8_t *)(p + i * step); break; \
      case 'b': for (Py_ssize_t i = 0; i < n; i++) y[i] = (T)*(const int8_t *)(p + i * step); break;           \
      case 'h': for (Py_ssize_t i = 0; i < n; i++) y[i] = (T)*(const int16_t *)(p + i * step); break;          \
      case 'H': for (Py_ssize_t i = 0; i < n; i++) y[i] = (T)*(const uint16_t *)(p + i * step); break;         \
      case 'i': for (Py_ssize_t i = 0; i < n; i++) y[i] = (T)*(const int32_t *)(p + i * step); break;          \
      case 'I': for (Py_ssize_t i = 0; i < n; i++) y[i] = (T)*(const uint32_t *)(p + i * step); break;         \
      default: for (Py_ssize_t i = 0; i < n; i++) y[i] = (T)*(const int64_t *)(p + i * step); break;           \
    }                                                                                                          \
  }                                                                                                            \
  /* reg[r]: where register r's block is: an input's own memory where its last axis is contiguous,   \
   * an output's where an output is read from it (no copies), else a buffer of EC_BLOCK in regs */       \
  static void ec_run_##SFX(const int32_t *code, Py_ssize_t n_ops, Py_ssize_t n_in, Py_ssize_t n_regs,          \
                           char *const *base, const Py_ssize_t *strides, int ndim, const Py_ssize_t *shape,    \
                           Py_ssize_t n_out, T *const *outs, const int32_t *out_regs, T *regs,                 \
                           const char *uniform, const int32_t *pro, Py_ssize_t n_pro, const char *ikind) {     \
    Py_ssize_t inner = ndim ? shape[ndim - 1] : 1, outer = 1, idx[EC_MAX_DIMS] = {0};                          \
    T *reg[EC_MAX_REGS];                                                                                       \
    for (Py_ssize_t r = 0; r < n_regs; r++) reg[r] = regs + r * EC_BLOCK;                                      \
    /* the uniform inputs (one element) filled once, and the ops of them alone (pro) run once */       \
    for (Py_ssize_t r = 0; r < n_in; r++)                                                                      \
      if (uniform[r]) ec_load_##SFX(reg[r], base[r], 0, EC_BLOCK, ikind[r]);                                   \
    ec_ops_##SFX(pro, n_pro, reg, EC_BLOCK);                                                                   \
    for (int d = 0; d + 1 < ndim; d++) outer *= shape[d];                                                      \
    /* short rows: a block of several, each input's gathered row by row, so the ops run over the     \
     * whole block ((C, 1, 1) against (N, C, 2, 2) gave blocks of 4) */                                  \
    Py_ssize_t rows = inner >= EC_BLOCK / 2 ? 1 : EC_BLOCK / inner;                                            \
    for (Py_ssize_t o = 0; rows > 1 && o < outer; o += rows) {                                                 \
      Py_ssize_t k = outer - o < rows ? outer - o : rows;                                                      \
      for (Py_ssize_t j = 0; j < k; j++) {                                                                     \
        for (Py_ssize_t r = 0; r < n_in; r++) {                                                                \
          if (uniform[r]) continue;                                                                            \
          const Py_ssize_t *s = strides + r * EC_MAX_DIMS;                                                     \
          const char *p = base[r];                                                                             \
          for (int d = 0; d + 1 < ndim; d++) p += idx[d] * s[d];                                               \
          Py_ssize_t last = s[ndim - 1];                                                                       \
          ec_load_##SFX(regs + r * EC_BLOCK + j * inner, p, last, inner, ikind[r]);                            \
        }                                                                                                      \
        for (int d = ndim - 2; d >= 0; d--) {                                                                  \
          if (++idx[d] < shape[d]) break;                                                                      \
          idx[d] = 0;                                                                                          \
        }                                                                                                      \
      }                                                                                                        \
      for (Py_ssize_t r = 0; r < n_in; r++) reg[r] = regs + r * EC_BLOCK;                                      \
      for (Py_ssize_t j = 0; j < n_out; j++) reg[out_regs[j]] = outs[j] + o * inner;                           \
      ec_ops_##SFX(code, n_ops, reg, k * inner);                                                               \
    }                                                                                                          \
    for (Py_ssize_t o = 0; rows == 1 && o < outer; o++) {                                                      \
      for (Py_ssize_t start = 0; start < inner; start += EC_BLOCK) {                                           \
        Py_ssize_t n = inner - start < EC_BLOCK ? inner - start : EC_BLOCK;                                    \
        for (Py_ssize_t r = 0; r < n_in; r++) {                                                                \
          if (uniform[r]) continue;                                                                            \
          const Py_ssize_t *s = strides + r * EC_MAX_DIMS;                                                     \
          char *p = base[r];                                                                                   \
          for (int d = 0; d + 1 < ndim; d++) p += idx[d] * s[d];                                               \
          Py_ssize_t last = ndim ? s[ndim - 1] : 0;                                                            \
          p += start * last;                                                                                   \
          if (!ikind[r] && last == (Py_ssize_t)sizeof(T)) {                                                    \
            reg[r] = (T *)p; /* read only: ops write registers n_in and up */                                  \
          } else {                                                                                             \
            reg[r] = regs + r * EC_BLOCK;                                                                      \
            ec_load_##SFX(reg[r], p, last, n, ikind[r]);                                                       \
          }                                                                                                    \
        }                                                                                                      \
        for (Py_ssize_t j = 0; j < n_out; j++) reg[out_regs[j]] = outs[j] + o * inner + start;                 \
        ec_ops_##SFX(code, n_ops, reg, n);                                                                     \
      }                                                                                                        \
      for (int d = ndim - 2; d >= 0; d--) {                                                                    \
        if (++idx[d] < shape[d]) break;                                                                        \
        idx[d] = 0;                                                                                            \
      }                                                                                                        \
    }                                                                                                          \
  }

EC_DEFINE(float, float, exp_floats, logf, tanh_floats, sqrtf, fabsf)
EC_DEFINE(double, double, exp_doubles, log, tanh_doubles, sqrt, fabs)

/* an input's kind: 'f' or 'd' (float32, float64), an integer's or bool's format ('?', 'b', 'B', 'h',
 * 'H', 'i', 'I', 'q' for any signed 64-bit one), or 0: none the chain reads */
static char ec_item(const Py_buffer *b) {
  const char *f = b->format ? b->format : "B";
  if (f[0] == '<' || f[0] == '=' || f[0] == '@') f++;
  if (strlen(f) != 1) return 0;
  char k = f[0];
  if (k == 'l' || k == 'q') return b->itemsize == 8 ? 'q' : (b->itemsize == 4 ? 'i' : 0);
  static const char kinds[] = "fdi?bBhHI";
  static const Py_ssize_t sizes[] = {4, 8, 4, 1, 1, 1, 2, 2, 4};
  const char *at = strchr(kinds, k);
  return at && b->itemsize == sizes[at - kinds] ? k : 0;
}

static PyObject *elementwise_chain(PyObject *module, PyObject *args) {
  PyObject *o_code, *o_in, *o_regs, *o_empty;
  Py_ssize_t n_regs;
  (void)module;
  if (!PyArg_ParseTuple(args, "OOOnO", &o_code, &o_in, &o_regs, &n_regs, &o_empty)) return NULL;
  if (!PyTuple_Check(o_in) && !PyList_Check(o_in)) {
    PyErr_SetString(PyExc_TypeError, "elementwise_chain: inputs must be a tuple or a list");
    return NULL;
  }
  PyObject **items = PySequence_Fast_ITEMS(o_in);
  Py_ssize_t n_in = PySequence_Fast_GET_SIZE(o_in);
  if (n_in < 1 || n_in > EC_MAX_INPUTS || n_regs > EC_MAX_REGS || n_in > n_regs) {
    PyErr_Format(PyExc_ValueError, "elementwise_chain: %zd inputs (at most %d) and %zd registers (at most %d)", n_in,
                 EC_MAX_INPUTS, n_regs, EC_MAX_REGS);
    return NULL;
  }
  Py_buffer bc, br, bin[EC_MAX_INPUTS], bout[EC_MAX_REGS];
  Py_ssize_t got_in = 0, got_out = 0, n_out = 0;
  int held_code = 0, held_regs = 0;
  PyObject *result = NULL, *list = NULL;
  char *base[EC_MAX_INPUTS];
  void *outs[EC_MAX_REGS];
  Py_ssize_t strides[EC_MAX_INPUTS * EC_MAX_DIMS], shape[EC_MAX_DIMS], dims[EC_MAX_INPUTS][EC_MAX_DIMS];
  uint64_t deps[EC_MAX_REGS];
  if (PyObject_GetBuffer(o_code, &bc, PyBUF_SIMPLE) < 0) goto done;
  held_code = 1;
  if (PyObject_GetBuffer(o_regs, &br, PyBUF_SIMPLE) < 0) goto done;
  held_regs = 1;
  Py_ssize_t n_ops = bc.len / (4 * EC_REC);
  n_out = br.len / 4;
  const int32_t *code = bc.buf, *out_regs = br.buf;
  if (bc.len % (4 * EC_REC) || br.len % 4 || n_out < 1 || n_out > EC_MAX_REGS || n_in + n_ops > n_regs) {
    PyErr_SetString(PyExc_ValueError, "elementwise_chain: code must be int32 records of 5, out_regs int32s, within "
                    "n_regs");
    goto done;
  }
  for (Py_ssize_t r = 0; r < n_in; r++) deps[r] = (uint64_t)1 << r;
  for (Py_ssize_t k = 0; k < n_ops; k++) {
    const int32_t *q = code + EC_REC * k;
    /* ops read registers written before them, and write the next one: registers are single-assignment */
    if (q[0] < 0 || q[0] >= EC_OPS || q[1] != n_in + k || q[2] < 0 || q[2] >= q[1] || q[3] < 0 || q[3] >= q[1] ||
        q[4] < 0 || q[4] >= q[1]) {
      PyErr_Format(PyExc_ValueError, "elementwise_chain: op %zd of the code is out of range", k);
      goto done;
    }
    deps[q[1]] = deps[q[2]] | deps[q[3]] | deps[q[4]];
  }
  for (Py_ssize_t j = 0; j < n_out; j++)
    if (out_regs[j] < n_in || out_regs[j] >= n_in + n_ops) {
      PyErr_SetString(PyExc_ValueError, "elementwise_chain: an output register is not an op's");
      goto done;
    }
  char kind = 0, ikind[EC_MAX_INPUTS] = {0};
  int ndim = 0, declined = 0;
  for (; got_in < n_in; got_in++) {
    if (PyObject_GetBuffer(items[got_in], &bin[got_in], PyBUF_STRIDED_RO | PyBUF_FORMAT) < 0) goto done;
    Py_buffer *b = &bin[got_in];
    char k2 = ec_item(b);
    int is_float = k2 == 'f' || k2 == 'd';
    if (!k2 || (is_float && kind && k2 != kind) || b->ndim > EC_MAX_DIMS) {
      got_in++;
      declined = 1;
      break;
    }
    if (is_float) kind = k2;
    else ikind[got_in] = k2;
    if (b->ndim > ndim) ndim = b->ndim;
    base[got_in] = b->buf;
  }
  /* the chain's type: its float inputs'; a Cast to it alone, an integer input read by a Cast or as a
   * Where's condition alone (as numpy's form: an Add of an integer input would not be T) */
  if (!kind) declined = 1;
  for (Py_ssize_t k = 0; !declined && k < n_ops; k++) {
    const int32_t *q = code + EC_REC * k;
    if (q[0] == EC_CAST_FLOAT || q[0] == EC_CAST_DOUBLE) {
      if ((q[0] == EC_CAST_FLOAT) != (kind == 'f')) declined = 1;
      continue;
    }
    for (int j = q[0] == EC_WHERE ? 3 : 2; j < EC_REC; j++)
      if (q[j] < n_in && ikind[q[j]]) declined = 1;
  }
  /* numpy's broadcast of all inputs, and of each output's inputs, which must be the same */
  for (int d = 0; !declined && d < ndim; d++) {
    shape[d] = 1;
    for (Py_ssize_t r = 0; r < n_in; r++) {
      int lead = ndim - bin[r].ndim;
      Py_ssize_t dim = dims[r][d] = d < lead ? 1 : bin[r].shape[d - lead];
      strides[r * EC_MAX_DIMS + d] = dim == 1 ? 0 : bin[r].strides[d - lead];
      if (dim != 1 && shape[d] != dim) {
        if (shape[d] != 1) declined = 1;
        shape[d] = dim;
      }
    }
    for (Py_ssize_t j = 0; !declined && j < n_out; j++) {
      Py_ssize_t got = 1;
      for (Py_ssize_t r = 0; r < n_in; r++)
        if (deps[out_regs[j]] >> r & 1 && dims[r][d] != 1) got = dims[r][d];
      if (got != shape[d]) declined = 1;
    }
  }
  /* ops left to libm (log; exp, tanh and sigmoid of double) are a call per element, where numpy's
   * loops are vectors: past EC_LIBM_MAX elements numpy's form is the faster one */
  Py_ssize_t total = 1;
  for (int d = 0; d < ndim; d++) total *= shape[d];
  for (Py_ssize_t k = 0; !declined && total > EC_LIBM_MAX && k < n_ops; k++) {
    int op = code[EC_REC * k];
    if (op == EC_LOG || (kind == 'd' && (op == EC_EXP || op == EC_TANH || op == EC_SIGMOID))) declined = 1;
  }
  if (declined) {
    result = Py_None;
    Py_INCREF(result);
    goto done;
  }
  /* the axes run over: those of size 1 dropped, and an axis merged into the next where every
   * input steps over both as over one (numpy's iterator does the same), so a block is a long run
   * wherever the layouts allow (an elementwise op on [N, C, H, 1] would be blocks of 1) */
  int cdim = 0, empty = 0;
  Py_ssize_t cshape[EC_MAX_DIMS];
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == 0) empty = 1;
    if (shape[d] == 1) continue;
    int merge = cdim > 0;
    for (Py_ssize_t r = 0; merge && r < n_in; r++)
      if (strides[r * EC_MAX_DIMS + cdim - 1] != strides[r * EC_MAX_DIMS + d] * shape[d]) merge = 0;
    if (merge) cshape[cdim - 1] *= shape[d];
    else cshape[cdim++] = shape[d];
    for (Py_ssize_t r = 0; r < n_in; r++) strides[r * EC_MAX_DIMS + cdim - 1] = strides[r * EC_MAX_DIMS + d];
  }
  /* short rows of a large output: gathered row by row and input by input, which costs more than
   * numpy's broadcasting loops save by the fusion (hf_convnextv2's [2, 256, 32] 45 us, numpy's 23) */
  if (!empty && cdim > 1 && cshape[cdim - 1] < EC_BLOCK / 2 && total > EC_SHORT_ROWS_MAX) {
    result = Py_None;
    Py_INCREF(result);
    goto done;
  }
  /* inputs of one element, and the ops of them alone (an epsilon's square root, 1 - a constant):
   * run once before the blocks, not per element; an output stays in the blocks, which write it */
  char uniform[EC_MAX_REGS] = {0};
  int32_t pro[EC_REC * EC_MAX_REGS], body[EC_REC * EC_MAX_REGS];
  Py_ssize_t n_pro = 0, n_body = 0;
  for (Py_ssize_t r = 0; r < n_in; r++) {
    uniform[r] = 1;
    for (int d = 0; d < cdim; d++)
      if (strides[r * EC_MAX_DIMS + d]) uniform[r] = 0;
  }
  for (Py_ssize_t k = 0; k < n_ops; k++) {
    const int32_t *q = code + EC_REC * k;
    int u = uniform[q[2]] && uniform[q[3]] && uniform[q[4]];
    for (Py_ssize_t j = 0; u && j < n_out; j++)
      if (out_regs[j] == q[1]) u = 0;
    uniform[q[1]] = (char)u;
    memcpy(u ? pro + EC_REC * n_pro++ : body + EC_REC * n_body++, q, 4 * EC_REC);
  }
  PyObject *tshape = PyTuple_New(ndim);
  if (!tshape) goto done;
  for (int d = 0; d < ndim; d++) {
    PyObject *v = PyLong_FromSsize_t(shape[d]);
    if (!v) {
      Py_DECREF(tshape);
      goto done;
    }
    PyTuple_SET_ITEM(tshape, d, v);
  }
  list = PyList_New(n_out);
  for (; list && got_out < n_out; got_out++) {
    PyObject *y = PyObject_CallFunction(o_empty, "(Os)", tshape, kind == 'f' ? "float32" : "float64");
    if (!y) break;
    PyList_SET_ITEM(list, got_out, y);
    if (PyObject_GetBuffer(y, &bout[got_out], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) break;
    outs[got_out] = bout[got_out].buf;
  }
  Py_DECREF(tshape);
  if (!list || got_out < n_out) goto done;
  if (!empty) {
    void *regs = PyMem_Malloc((size_t)n_regs * EC_BLOCK * (kind == 'f' ? 4 : 8));
    if (!regs) {
      PyErr_NoMemory();
      goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    if (kind == 'f')
      ec_run_float(body, n_body, n_in, n_regs, base, strides, cdim, cshape, n_out, (float *const *)outs, out_regs, regs,
                   uniform, pro, n_pro, ikind);
    else
      ec_run_double(body, n_body, n_in, n_regs, base, strides, cdim, cshape, n_out, (double *const *)outs, out_regs,
                    regs, uniform, pro, n_pro, ikind);
    Py_END_ALLOW_THREADS
    PyMem_Free(regs);
  }
  result = list;
  list = NULL;
done:
  for (Py_ssize_t k = 0; k < got_in; k++) PyBuffer_Release(&bin[k]);
  for (Py_ssize_t k = 0; k < got_out; k++) PyBuffer_Release(&bout[k]);
  Py_XDECREF(list);
  if (held_regs) PyBuffer_Release(&br);
  if (held_code) PyBuffer_Release(&bc);
  return result;
}
/* ---- end of elementwise chains ---- */

static PyMethodDef module_methods[] = {
    {"forest_build", forest_build, METH_VARARGS,
     "forest_build(trees, ids, leaf, true_ids, false_ids, leaf_trees, leaf_ids, true_next, false_next, roots, "
     "leaf_at, owner, count, first, visited, tree_depth) -> (status, a, b): a tree ensemble's links, roots, leaf "
     "positions and tree shape in one pass (ml_trees.TREE_BUILD_PATHS['native'])."},
    {"logsumexp_rows", logsumexp_rows, METH_VARARGS,
     "logsumexp_rows(x, y, n) -> bool: log(sum(exp(row))) of each row of n float32 values of x into y, by the row's "
     "maximum; False where a row holds a NaN or +inf or is -inf throughout."},
    {"grid_sample_linear", grid_sample_linear, METH_VARARGS,
     "grid_sample_linear(out, x, grid, n, c, h, w, gh, gw, align, padding) -> bool: bilinear GridSample of float32 "
     "x [n, c, h, w] at grid [n, gh, gw, 2] into out [n, c, gh, gw] (padding 0 zeros, 1 border, 2 reflection); "
     "False where a coordinate is not finite or too large."},
    {"resize_last_two", resize_last_two, METH_VARARGS,
     "resize_last_two(out, x, planes, in_h, in_w, out_h, out_w, idx, w, lerp_rows, lerp_cols): nearest or "
     "linear Resize of float32 planes by per-row and per-column taps"},
    {"scatter_elements", scatter_elements, METH_VARARGS,
     "scatter_elements(out, idx, upd, outer, length, rows, inner, reduction) -> -1 or the first bad index's "
     "position: float32 updates along the middle axis of out [outer, length, inner], in place."},
    {"scatter_nd", scatter_nd, METH_VARARGS,
     "scatter_nd(out, idx, upd, dims, inner, reduction) -> -1 or the first bad row: float32 slices of inner "
     "values at idx's rows [rows, k] of out, in place."},
    {"nms_keep", nms_keep, METH_VARARGS,
     "nms_keep(corners, order, kept, count, iou_max, limit) -> count: greedy NonMaxSuppression of order's boxes "
     "after the count already kept."},
    {"gelu", gelu, METH_VARARGS,
     "gelu(y, coefficients): y = gelu(y) in place by numerics' polynomial (float32)."},
    {"softmax_rows", softmax_rows, METH_VARARGS,
     "softmax_rows(x, y, n) -> bool: softmax of each row of n float32 values of x into y; False where a row holds "
     "a NaN or +inf or is -inf throughout."},
    {"layer_norm", layer_norm, METH_VARARGS,
     "layer_norm(x, scale, bias, y, mean, inv_std, eps): rows of len(scale) float32 values normalized in float64 "
     "into y (float32), times scale plus bias (or None); the rows' means and inverse deviations into mean and "
     "inv_std (float64)."},
    {"rms_norm", rms_norm, METH_VARARGS,
     "rms_norm(x, scale, y, inv, eps): rows of len(scale) float32 values of x divided by their root mean square "
     "(sum of squares in float64) into y, times scale; the rows' 1 / rms into inv (float32) unless it is None."},
    {"attention_small", attention_small, METH_VARARGS,
     "attention_small(q, k, v, mask, out, (b, kvh, rows, s, t, d, dv, mb, ms), offset, scale) -> bool: "
     "softmax(q k^T * scale, boolean mask, causal from offset >= 0) v of float32 query rows grouped by key-value "
     "head into out; False where a score is not finite."},
    {"rotary", rotary, METH_VARARGS,
     "rotary(x, cos, sin, pos, out, (b, n, s, h, half, cache_rows, cb, pb), x_heads_first, out_heads_first, "
     "interleaved) -> -1 or "
     "the first bad position's index: rotary embedding of float32 heads by cache rows at positions (or per step)."},
    {"quantize_linear", quantize_linear, METH_VARARGS,
     "quantize_linear(x, y, scale, zero_point, lo, hi): y = saturate(rint(x / scale) + zero_point) into [lo, hi] "
     "(x float32; y int8, uint8, int16 or uint16), NaN to lo."},
    {"dequantize_linear", dequantize_linear, METH_VARARGS,
     "dequantize_linear(x, y, scale, zero_point): y = (x - zero_point) * scale (x int8, uint8, int16 or uint16; "
     "y float32)."},
    {"requantize", requantize, METH_VARARGS,
     "requantize(acc, y, multiplier, zero_point, lo, hi): y = saturate(rint(acc * multiplier) + zero_point) into "
     "[lo, hi] (acc float32; y int8 or uint8), NaN to lo."},
    {"quantize_dequantize", quantize_dequantize, METH_VARARGS,
     "quantize_dequantize(x, y, scale, lo, hi): y = (clamp(rint(x / scale), lo, hi) + 0.0) * scale, float32."},
    {"dynamic_quantize", dynamic_quantize, METH_VARARGS,
     "dynamic_quantize(x, f) -> (scale, zero_point): onnxruntime's dynamic uint8 quantization of x (float32), the "
     "codes less the zero point into f (float32)."},
    {"coupling", coupling, METH_VARARGS,
     "coupling(v, pair_i, pair_j, k, out): libsvm's pairwise coupling of each row's pairwise probabilities "
     "v (float32 [rows, pairs]) into class probabilities out (float32 [rows, k])."},
    {"hard_swish", hard_swish, METH_VARARGS,
     "hard_swish(y, alpha, beta): y *= min(max(alpha y + beta, 0), 1) in place (float32 or float64)."},
    {"platt", platt, METH_VARARGS,
     "platt(scores, prob_a, prob_b, v): libsvm's clipped pairwise probabilities of the pairwise scores (float32 "
     "[rows, pairs]) into v."},
    {"gru_steps", gru_steps, METH_VARARGS,
     "gru_steps(xw, rt, h, y, d, first, count, step, linear_before_reset, rbh, lens[, bias]): count steps of one GRU "
     "direction in its default form (recurrent.py's GRU._run_native); rows past their lens keep their state."},
    {"rnn_steps", rnn_steps, METH_VARARGS,
     "rnn_steps(xw, rt, h, y, d, first, count, step, lens[, bias]): count steps of one RNN direction in its "
     "default form (recurrent.py's RNN._run_native); rows past their lens keep their state."},
    {"lstm_steps", lstm_steps, METH_VARARGS,
     "lstm_steps(xw, rt, h, c, y, d, first, count, step[, mult]): count steps of one LSTM direction in its "
     "default form from step first by step (1 or -1), updating h and c and writing each step's h to y[t, d]; "
     "with mult, h quantized row by row before its product with rt (DynamicQuantizeLSTM)."},
    {"depthwise_channels", depthwise_channels, METH_VARARGS,
     "depthwise_channels(x, w, b, y, strides, pads, dilations[, act, p0, p1]): a depthwise convolution of x [N, C, "
     "H, W] with w [C, 1, KH, KW] (and bias b or None) into y [N, C, OH, OW], vectorised across channels over a "
     "channel-last copy (for small planes); pads and act as direct_conv's."},
#if defined(__GNUC__)
    {"depthwise_unit", depthwise_unit, METH_VARARGS,
     "depthwise_unit(x, w, b, y, pads[, act, p0, p1]): a depthwise convolution of x [N, C, H, W] with w [C, 1, "
     "KH, KW] (and bias b or None) into y [N, C, OH, OW] at unit strides and dilations, every tap reaching the "
     "input; DW_ROWS output rows summed at once; pads and act as direct_conv's."},
#endif
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
    {"packed_gemm_supported", packed_gemm_supported, METH_NOARGS,
     "packed_gemm_supported(): whether this CPU runs packed_gemm (AVX-512)."},
    {"packed_gemm", packed_gemm, METH_VARARGS,
     "packed_gemm(wp, x, b, y, blocks): y[i] = W x[i] (+ b) over the blocks range(*blocks) of PACKED_GEMM_BLOCK "
     "output channels, W packed as [ceil(M / PACKED_GEMM_BLOCK), K, PACKED_GEMM_BLOCK] (zero rows past M); x [N, "
     "K, P], b [M] or None, y [N, M, P], float32."},
#endif
    {"direct_conv", direct_conv, METH_VARARGS,
     "direct_conv(x, w, b, y, strides, pads, dilations, group[, act, p0, p1]): a convolution of x [N, C, H, W] "
     "with w [M, C / group, KH, KW] (and bias b or None) into y [N, M, OH, OW] by each tap's multiply-add over "
     "the output plane; pads (top, left), the bottom and right ones implied by y's size; act 1 clamps the "
     "outputs to [p0, p1], 2 applies hard swish (alpha p0, beta p1)."},
    {"shifted_conv", shifted_conv, METH_VARARGS,
     "shifted_conv(x, w, b, y, pads[, act, p0, p1]): direct_conv at unit strides and dilations, ungrouped, over "
     "kw column-shifted copies of each input channel, so a tile sums only output cells (small planes)."},
    {"pointwise_conv", pointwise_conv, METH_VARARGS,
     "pointwise_conv(wt, x, b, z, y[, act, p0, p1]): a 1x1 convolution of x [N, K, P] into y [N, M, P] with the "
     "weights transposed and zero-padded, wt [K, MP] (MP a multiple of POINTWISE_BLOCK), bias b [M] and residual z "
     "[N, M, P] or None; act as direct_conv's."},
    {"small_conv", small_conv, METH_VARARGS,
     "small_conv(wt, x, b, z, y, strides, pads, kernel[, act, p0, p1]): an ungrouped convolution of x [N, C, H, W] "
     "into y [N, M, OH, OW] (dilation 1) by im2col into a stack buffer and pointwise_conv's product with its "
     "transposed weights wt [C KH KW, MP]; pads (top, left); act as direct_conv's."},
    {"max_pool_2d", max_pool_2d, METH_VARARGS,
     "max_pool_2d(x, y, kernel, strides, pads, dilations): each window's maximum of x [N, C, H, W] into y [N, C, "
     "OH, OW] (float32 or float64), each output row's window rows through a row buffer, then its column phases; "
     "pads the leading ones, a window of padding alone gives -inf."},
    {"max_pool_3d", max_pool_3d, METH_VARARGS,
     "max_pool_3d(x, y, kernel, strides, pads, dilations): each window's maximum of x [N, C, D, H, W] into y "
     "[N, C, OD, OH, OW] (float32 or float64), one axis at a time; pads the leading ones, a window of padding "
     "alone -inf."},
    {"elementwise_chain", elementwise_chain, METH_VARARGS,
     "elementwise_chain(code, inputs, out_regs, n_regs, empty): a com.onnxhal ElementwiseChain's program (int32 "
     "quads op, dst, a, b over registers) over the inputs (a tuple or list, broadcast): the outputs, made by "
     "empty(shape, dtype), as a list; None where it declines (inputs not all float32 or all float64, shapes "
     "that do not broadcast, an output whose inputs broadcast to less than the whole shape)."},
    {NULL, NULL, 0, NULL}};

static PyMethodDef forest_methods[] = {
    {"evaluate", (PyCFunction)forest_evaluate, METH_VARARGS,
     "evaluate(x, how, scores, written): the trees' aggregated leaf weights per row into scores "
     "(how 0-3: SUM, AVERAGE, MIN, MAX), and which outputs a leaf wrote into written (or None)."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject ForestType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "onnxhal.runtime.providers.cpu.kernels._native.Forest",
    .tp_basicsize = sizeof(Forest),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A tree ensemble's nodes, roots and leaf weights, copied once, walked per row by evaluate().",
    .tp_new = forest_new,
    .tp_dealloc = (destructor)forest_dealloc,
    .tp_methods = forest_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_native",
    .m_doc = "The CPU EP's optional C kernels (tree ensembles, libsvm's pairwise coupling, LSTM steps, direct "
              "convolutions, fused activations).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__native(void) {
  if (PyType_Ready(&ForestType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (!m) return NULL;
  Py_INCREF(&ForestType);
  if (PyModule_AddObject(m, "Forest", (PyObject *)&ForestType) < 0) {
    Py_DECREF(&ForestType);
    Py_DECREF(m);
    return NULL;
  }
  /* small_conv's stack buffer of windows, C KH KW x OH OW cells at most, for its callers */
  if (PyModule_AddIntConstant(m, "SMALL_CONV_MAX_CELLS", SC_CELLS) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  /* pointwise_conv's padding of the transposed weight rows, for its callers */
  if (PyModule_AddIntConstant(m, "POINTWISE_BLOCK", PW_BLOCK) < 0) {
    Py_DECREF(m);
    return NULL;
  }
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
  /* packed_gemm's weight layout's block of output channels, for its callers' packing */
  if (PyModule_AddIntConstant(m, "PACKED_GEMM_BLOCK", PG_MR) < 0) {
    Py_DECREF(m);
    return NULL;
  }
#endif
  return m;
}
