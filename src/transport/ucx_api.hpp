// UCX's functions, looked up in libucp the first time a process starts a
// job that spans servers, instead of linked into the library: a process
// that never spans servers never loads UCX. What that spares it: libucm,
// which comes with UCX, hooks mmap, munmap and brk in the whole process when
// it is loaded, and a child forked while another thread is inside one of
// those calls inherits the hook's lock held, so that its ucp_init() waits
// forever (docs/reliability.md). The types, constants and macros still come
// from UCX's headers; only the calls go through this table.
#pragma once

#include <ucp/api/ucp.h>

#include "fastgather/status.hpp"

namespace fastgather::transport {

// Every UCX function the transport calls (ucp_init is an inline wrapper of
// ucp_init_version in UCX's header).
#define FG_UCX_FUNCTIONS(X)                                                                                  \
  X(ucp_config_read) X(ucp_config_modify) X(ucp_config_release) X(ucp_init_version) X(ucp_cleanup)          \
  X(ucp_get_version_string) X(ucp_worker_create) X(ucp_worker_destroy) X(ucp_worker_get_efd) X(ucp_worker_arm) \
  X(ucp_worker_get_address) X(ucp_worker_release_address) X(ucp_worker_progress) X(ucp_ep_create)           \
  X(ucp_ep_close_nbx) X(ucp_tag_send_nbx) X(ucp_tag_recv_nbx) X(ucp_tag_probe_nb) X(ucp_tag_recv_request_test)                 \
  X(ucp_request_check_status) X(ucp_request_cancel) X(ucp_request_free) X(ucs_status_string)

struct UcxApi {
#define FG_UCX_POINTER(name) decltype(&::name) name = nullptr;
  FG_UCX_FUNCTIONS(FG_UCX_POINTER)
#undef FG_UCX_POINTER
  // ucp_init(), as UCX's header defines it.
  ucs_status_t init(const ucp_params_t* params, const ucp_config_t* config, ucp_context_h* context) const {
    return ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, params, config, context);
  }
};

// Loads libucp and finds every function, once per process: the same table,
// or the same error (naming the library and what the loader said), on every
// later call. Thread-safe. The library is never unloaded.
Result<const UcxApi*> load_ucx();

// The table load_ucx() filled. Only after it succeeded: every object that
// calls UCX exists only once a UcxContext does, which loads it.
const UcxApi& ucx();

}  // namespace fastgather::transport
