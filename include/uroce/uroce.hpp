// uroce C++ API: everything. See docs/cxx-api.md.
//
// Written against the public libibverbs / librdmacm C ABI only, so a program using it runs
// over uroce and, unchanged, over rdma-core on RDMA hardware.
#pragma once

#include "uroce/ah.hpp"
#include "uroce/cm.hpp"
#include "uroce/coro.hpp"
#include "uroce/cq.hpp"
#include "uroce/device.hpp"
#include "uroce/endpoint.hpp"
#include "uroce/memory.hpp"
#include "uroce/oob.hpp"
#include "uroce/qp.hpp"
#include "uroce/result.hpp"
#include "uroce/srq.hpp"
#include "uroce/work_request.hpp"
#include "uroce/wr_id.hpp"
