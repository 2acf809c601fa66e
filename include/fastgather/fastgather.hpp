#pragma once
#include "fastgather/communicator.hpp"
#include "fastgather/launch.hpp"
#include "fastgather/ops.hpp"
#include "fastgather/status.hpp"
#include "fastgather/tensor.hpp"
#include "fastgather/version.hpp"
