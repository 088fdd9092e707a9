
#include "header.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#ifndef TNB_LEAF_T
#define TNB_LEAF_T float
#endif
#define TNB_NOUT (N_TARGET * MAX_N_CLASS)

int32_t triton_nb_shim_version(void) { return TNB_SHIM_VERSION; }
int32_t triton_nb_num_outputs(void) { return TNB_NOUT; }

static void tnb_rows(const float* x, int64_t begin, int64_t end, int32_t ncol, int32_t nfeat,
                     union Entry* buf, float* out) {
  TNB_LEAF_T res[TNB_NOUT];
  for (int64_t i = begin; i < end; ++i) {
    const float* row = x + i * (int64_t)ncol;
    for (int32_t j = 0; j < nfeat; ++j) {
      if (j < ncol && !isnan(row[j])) {
        buf[j].fvalue = row[j];
      } else {
        buf[j].missing = -1;
      }
    }
    for (int k = 0; k < TNB_NOUT; ++k) res[k] = (TNB_LEAF_T)0;
    predict(buf, 0, res);
    float* o = out + i * (int64_t)TNB_NOUT;
    for (int k = 0; k < TNB_NOUT; ++k) o[k] = (float)res[k];
  }
}

int triton_nb_predict(const float* x, int64_t nrow, int32_t ncol, int32_t nthread, float* out) {
  int32_t nfeat = get_num_feature();
  if (nfeat < 1) nfeat = 1;
#ifdef _OPENMP
  if (nthread > 1 && nrow > 1) {
    int failed = 0;
    if ((int64_t)nthread > nrow) nthread = (int32_t)nrow;
#pragma omp parallel num_threads(nthread)
    {
      union Entry* buf = (union Entry*)malloc(sizeof(union Entry) * (size_t)nfeat);
      int t = omp_get_thread_num(), nt = omp_get_num_threads();
      int64_t chunk = (nrow + nt - 1) / nt;
      int64_t b = (int64_t)t * chunk, e = b + chunk < nrow ? b + chunk : nrow;
      if (!buf) {
#pragma omp atomic write
        failed = 1;
      } else if (b < e) {
        tnb_rows(x, b, e, ncol, nfeat, buf, out);
      }
      free(buf);
    }
    return failed ? -1 : 0;
  }
#endif
  union Entry* buf = (union Entry*)malloc(sizeof(union Entry) * (size_t)nfeat);
  if (!buf) return -1;
  tnb_rows(x, 0, nrow, ncol, nfeat, buf, out);
  free(buf);
  return 0;
}
