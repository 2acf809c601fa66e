#!/usr/bin/env bash
# Mutation checks: each test named below must FAIL when the code it guards is
# broken in the stated way. The tree is copied, each mutation applied to the
# copy alone (and checked to have changed the file), the test rebuilt and run.
# A test that still passes on a mutant asserts too little: that fails here.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
(cd "$ROOT" && git ls-files -z | tar --null -T - -cf -) | (cd "$WORK" && tar -xf -)
# -O1 without debug information: each mutant is a rebuild, and this compiles in
# about 60% of -O2 -g's time; what a test asserts does not depend on it.
cmake -S "$WORK" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DFG_WITH_MPI=OFF -DFG_WITH_TORCH=OFF >/dev/null

# FG_MUTATIONS_ONLY=REGEX runs only the mutations whose name matches (while writing one).
# name | file | perl substitution | test binary | gtest filter (no '|' inside a field)
MUTATIONS=(
  "fg-bench's all_to_all row never calls the library|tools/fg-bench/cases.cpp|s/return all_to_all\(g_, set\(it\)\.in\.view\(\), set\(it\)\.out\.view\(\)\);/return Status::Ok();/|test_bench|FgBench.AllToAllAndSendRecvBesideMpiChecked"
  "fg-bench's send_recv row sends its output buffer|tools/fg-bench/cases.cpp|s/Request sent = start_send\(g_, b\.in\.view\(\)/Request sent = start_send(g_, b.out.view()/|test_bench|FgBench.AllToAllAndSendRecvBesideMpiChecked"
  "fg-bench checks an output path's permission but writes no test byte|tools/fg-bench/host.cpp|s/if \(exists && !std::filesystem::is_regular_file\(p, ec\)\) \{/if (false) {/|test_bench|FgBench.BadFlagsAndSizesAreRefusedByName"
  "a store client whose deadline passed before its first try says (Success)|src/bootstrap/tcp_store.cpp|s/last_errno != 0 \? std::strerror\(last_errno\)/true ? std::strerror(last_errno)/|test_tcp_store|TcpStore.ADeadlineGoneBeforeTheFirstTrySaysSo"
  "a spawner starts no reaper for its job's segments|src/launch/launch.cpp|s/  const int reaper = start_segment_reaper\(job\);/  const int reaper = -1;/|test_launch|RunLocalRanks.ASpawnerKilledLeavesNoSegmentOfItsJob"
  "spawned ranks do not die with their spawner|src/launch/launch.cpp|s/::prctl\(PR_SET_PDEATHSIG, options\.death_signal\);//|test_bench|FgBench.ItsSpawnerKilledItsRanksDieAtOnceAndLeaveNoSegment"
  "a single-copy receive reads the message one byte off|src/ops/p2p.cpp|s/read_peer\(own\.from, dst, h\.remote, total\)/read_peer(own.from, dst, h.remote + 1, total - 1)/|test_p2p|PointToPoint/Ring.EveryByteReadFromTheSendersMemory/0"
  "a receive from the sender's heap reads the message one byte off|src/ops/p2p.cpp|s/heap->member_data\(own\.from, h\.remote\), total\)/heap->member_data(own.from, h.remote + 1), total)/|test_p2p|PointToPoint/Ring.EveryByteFromTheHeap/0"
  "a single-copy send is done before its bytes are read|src/ops/p2p.cpp|s/    co_return co_await engine::mail_room\(mail, to, chunk\);/    co_return Status::Ok();/|test_p2p|PointToPoint.ASingleCopyMessageThatDisagreesFailsBothSidesAtOnce"
  "fg-bench's --reduce-op never reaches the library|tools/fg-bench/reduce_cases.cpp|s/    options_\.op = s\.reduce_op;\n//|test_bench|FgBench.MinMaxAndAverageChecked"
  "ordinary memory past the mailbox always goes through it|src/ops/p2p.cpp|s/\(total <= ShmMail::kReadInPlaceMax \x7c\x7c/(false \x7c\x7c/|test_p2p|PointToPoint.OrdinaryMemoryUpToTheCutoffIsReadWhereItLies"
  "ordinary memory of any size is read where it lies|src/transport/shm_mail.hpp|s/kReadInPlaceMax = 2 << 20;/kReadInPlaceMax = size_t{1} << 40;/|test_p2p|PointToPoint.OrdinaryMemoryUpToTheCutoffIsReadWhereItLies"
  "an all_to_all within a server keeps its copy through the ring|src/ops/collectives.cpp|s/std::move\(sizes\), &landing_ref, stream_out, sink, Schedule::kAuto, nullptr, 0,/std::move(sizes), nullptr, stream_out, sink, Schedule::kAuto, nullptr, 0,/|test_exchanges|Exchanges.AllToAllBySingleCopyReadsOnlyEachSplit"
  "on a crowded host an owner offers no ordinary memory for single copy|src/algo/allgather.cpp|s/    readable = ch\.crowded\(\);/    readable = false;/|test_single_copy|SingleCopyPages.OnACrowdedHostPlainMemoryUpTo2MiBBySingleCopy"
  "on a crowded host an owner offers ordinary memory of any size|src/algo/allgather.cpp|s/ && mine <= kCrowdedSingleCopyMaxBytes\) \{/) {/|test_single_copy|SingleCopyPages.OnACrowdedHostPlainMemoryUpTo2MiBBySingleCopy"
  "the copy-in chooser learns from calls that copied nothing into the ring|src/algo/allgather.cpp|s/\(copies_own \x7c\x7c plan\.schedule == Schedule::kRing\);/true;/|test_single_copy|CopyIn.OnlyCallsThatCopyIntoTheRingTeachTheChooser"
  "a single-copy part is read from its block's start|src/algo/allgather.cpp|s/ch\.read_peer\(peer, dst \+ off, theirs\.addr \+ first \+ off, len\)/ch.read_peer(peer, dst + off, theirs.addr + off, len)/|test_exchanges|Exchanges.AllToAllBySingleCopyReadsOnlyEachSplit"
  "a single-copy part is copied from its block's start in the heap|src/algo/allgather.cpp|s/ch\.heap\(\)->member_data\(peer, theirs\.addr \+ first \+ off\)/ch.heap()->member_data(peer, theirs.addr + off)/|test_exchanges|Exchanges.AllToAllBySingleCopyReadsOnlyEachSplit"
  "UCX over TCP keeps its 8 KiB segments|src/transport/net_channel.cpp|s/::setenv\(\x22UCX_TCP_TX_SEG_SIZE\x22, kTcpSegment, 0\);/(void)0;/|test_multinode|Ucx.OverTcpAloneEagerSendsInLargeSegmentsUnlessTheUserSetThem"
  "UCX_TLS=tcp is not taken for TCP alone|src/transport/net_channel.cpp|s/if \(tls == \x22tcp\x22\) return true;/if (tls == \x22tcp\x22) return false;/|test_multinode|Ucx.OverTcpAloneEagerSendsInLargeSegmentsUnlessTheUserSetThem"
  "a scatter from a list sends from its block, not the list|src/algo/across.cpp|s/src = \(call_.part_from != nullptr \?/src = (false ?/|test_exchanges|Exchanges.AcrossServersEveryByte"
  "a scatter across servers moves the root's whole block within its server|src/algo/across.cpp|s/if \(call_.local_phase != nullptr\) \{/if (false) {/|test_exchanges|Exchanges.AcrossServersEveryByte"
  "a server's local phase with parts forgets where each member's span starts|src/algo/across.cpp|s/      if \(!lo.empty\(\)\) off \+= lo\[static_cast<size_t>\(m\)\];\n//|test_exchanges|Exchanges.AcrossServersEveryByte"
  "a flush waits for every send, later ones too|src/transport/net_channel.cpp|s/      if \(op->seq < mark\) done &= poll\(\*op, false\);/      if (true) done \&= poll(*op, false);/|test_p2p|PointToPoint.AFlushWaitsForTheSendsBeforeItNotForLaterOnes"
  "a receive between servers waits for the first message again|src/transport/net_channel.cpp|s/const uint32_t number = \+\+impl_->messages_received\[static_cast<size_t>\(from\)\];/const uint32_t number = impl_->messages_received[static_cast<size_t>(from)] + 1;/|test_p2p|PointToPoint/RingAcrossServers.*"
  "a receive from one member between servers takes only messages of tag fold 0|src/transport/net_channel.cpp|s/const uint64_t mask = ~uint64_t\{kPointToPointPiece - 1\};/const uint64_t mask = ~uint64_t{0};/|test_p2p|PointToPoint/RingAcrossServers.*"
  "a message between servers carries no fold of its tag|src/transport/net_channel.cpp|s/return kPointToPointPiece \x7c fold;/return kPointToPointPiece;/|test_p2p|PointToPoint.AnySourceAcrossServersPassesOverAnotherTagAlreadyThere"
  "a receive from any source between servers looks for a message already taken|src/transport/net_channel.cpp|s/const uint32_t number = impl_->messages_received\[static_cast<size_t>\(m\)\] \+ 1;/const uint32_t number = impl_->messages_received[static_cast<size_t>(m)];/|test_p2p|PointToPoint/AnySourceAcrossServers.*"
  "a receive from any source between servers never looks at the members here|src/engine/waits.hpp|s/if \(local_ && local_->ready\(\)\) return true;/if (false) return true;/|test_p2p|PointToPoint/AnySourceAcrossServers.*"
  "a collective takes the completion of a message's receive|src/transport/net_channel.cpp|s/if \(op->id == 0 && !op->reported && impl_->poll/if (!op->reported \&\& impl_->poll/|test_p2p|PointToPoint/RingAcrossServers.*"
  "a wait does not drive the group's sends and receives beside it|src/core/communicator.cpp|s/for \(engine::Queue\* q : impl_of\(\*g\)->queues\(\)\) pending \x7c= q->try_progress\(\);/pending \x7c= impl_of(*g)->queue.try_progress();/|test_p2p|PointToPoint/Ring.EveryByteWaitingForTheSendFirst/0"
  "receives wait in the collectives' queue|src/ops/p2p.cpp|s/return peer == kAnySource \? impl_of\(g\)->any_receives : \*impl_of\(g\)->receives\[static_cast<size_t>\(peer\)\];/return impl_of(g)->queue;/|test_p2p|PointToPoint.AReceiveDoesNotHoldUpTheCollectivesAfterIt"
  "a receive takes a message of another length|src/ops/p2p.cpp|s/h\.tag != tag \x7c\x7c h\.total != total\) \{/h.tag != tag) {/|test_p2p|PointToPoint.ALengthOrTagThatDisagreesIsFoundOnBothSides"
  "a receive from any source fails once any sender has left|src/engine/waits.hpp|s/      if \(s\.ok\(\)\) return s;/      if (!s.ok()) return s;/|test_p2p|PointToPoint.AnySourceTakesEachMessageOnceAndSaysWhoSentIt"
  "a sender writes over a chunk not yet taken|src/transport/shm_mail.cpp|s/return b\.r\.taken\.load\(std::memory_order_acquire\) \+ kSlots > next;/return b.r.taken.load(std::memory_order_acquire) + kSlots + 1 > next;/|test_p2p|PointToPoint/Ring.*:PointToPoint.ManyInFlight*"
  "a post does not wake a sleeping waiter|src/transport/shm_channel.cpp|s/(if \(w\.sleepers\.load\(std::memory_order_relaxed\) != 0\) \{\n\s*w\.futex_word\.fetch_add\(1, std::memory_order_release\);\n)\s*futex_wake_all\(&w\.futex_word\);/\1/|test_shm_channel|ShmChannel.SleepingWaiterIsWokenByPost"
  "claim() always returns offset 0|src/transport/shm_channel.cpp|s/\*offset = static_cast<uint32_t>\(cursor_\);/cursor_ = 0;\n  *offset = 0;/|test_shm_channel|ShmChannel.RingClaimsWrapAndStayLineAligned"
  "the all-gather sink drops the last byte of each piece|src/ops/collectives.cpp|s/if \(dst != src\) algo::copy_out\(dst, src, len, call\.stream_out\);/if (dst != src) algo::copy_out(dst, src, len - (len > 0), call.stream_out);/|test_allgather|*WorldSizes*"
  "the fused op keeps a stale bias in its scratch|src/ops/allgather_matmul.cpp|s/if \(bias\) \{\n(\s*)bias_f = c_buf \+ block_rows \* n;/bias_f = c_buf + block_rows * n;\n\1if (bias) {/|test_allgather_matmul|AllGatherMatmul/Fused.*"
  "the packed GEMM skips the last k of each pass|src/ops/gemm.cpp|s/for \(size_t kk = 0; kk < kc; \+\+kk\)/for (size_t kk = 0; kk + 1 < kc; ++kk)/|test_allgather_matmul|AllGatherMatmul/Fused.*packed"
  "the packed GEMM multiplies a 4-row tile as 3 rows|src/ops/gemm.cpp|s/case 4: return kernel<4>/case 4: return kernel<3>/|test_allgather_matmul|AllGatherMatmul/Fused.*packed"
  "the fused all-gather multiplies pieces as they land whatever x2's size and the rows|src/ops/allgather_matmul.cpp|s/const bool whole = ops::multiply_whole\(dt, rows_all, k, n\) [^;]*;/const bool whole = false;/|test_allgather_matmul|AllGatherMatmul/Fused.*"
  "the AVX-512 bf16 sum rounds ties down, not to even|src/ops/sum.cpp|s/_mm512_add_epi32\(_mm512_add_epi32\(x, half\), _mm512_and_si512\(high, one\)\)/_mm512_add_epi32(x, half)/|test_tensor|Sum.Bf16ByHandMatchesThePortableLoopBitForBit"
  "the AVX-512 bf16 sum leaves out the sources after the second|src/ops/sum.cpp|s/for \(int j = 2; j < n; \+\+j\) acc = _mm512_add_ps/for (int j = 2; j < 2; ++j) acc = _mm512_add_ps/|test_tensor|Sum.Bf16ByHandMatchesThePortableLoopBitForBit"
  "the AVX-512 kernel skips the last k of each pass|src/ops/gemm.cpp|s/for \(size_t kk = 0; kk < kc; \+\+kk\) \{\n(\s*)const __m512/for (size_t kk = 0; kk + 1 < kc; ++kk) {\n\1const __m512/|test_allgather_matmul|AllGatherMatmul/Fused.*packed"
  "the AVX-512 kernel multiplies a panel pair's second panel as its first|src/ops/gemm.cpp|s/b0 \+ k_ \* kCols, kc/b0, kc/|test_allgather_matmul|AllGatherMatmul/Fused.*packed"
  "FG_FUSED_GEMM=avx2 runs the AVX-512 kernel all the same|src/ops/gemm.cpp|s/settings\.fused_gemm != Settings::FusedGemm::kAvx2 && avx512_supported\(\)/avx512_supported()/|test_settings|Settings.FusedGemmAvx2*"
  "single copy leaves the last byte of each piece unread|src/algo/allgather.cpp|s/ch\.read_peer\(peer, dst \+ off, theirs\.addr \+ first \+ off, len\)/ch.read_peer(peer, dst + off, theirs.addr + first + off, len - 1)/|test_single_copy|WorldSizes/SingleCopy.*"
  "owners of in-place blocks leave without waiting for their readers|src/algo/allgather.cpp|s/  if \(st\.in_place\) \{\n    \/\/ An owner/  if (false \&\& st.in_place) {\n    \/\/ An owner/|test_single_copy|SymmetricFallback.*"
  "peers read an in-place block from the owner's ring|src/transport/shm_channel.hpp|s/: member_data\(member, l\.header\)\) \+ mine;/: member_data(member, l.header.offset)) + mine;/|test_single_copy|SymmetricFallback.*:SymmetricMixed.*"
  "members cut blocks by a step of their own, not the creator's|src/transport/shm_channel.cpp|s/pipeline_bytes_ = reinterpret_cast<const SegmentHeader\*>\(segment_\.data\(\)\)->pipeline_bytes;/pipeline_bytes_ = me_ == 0 ? reinterpret_cast<const SegmentHeader*>(segment_.data())->pipeline_bytes : ring_bytes_ \/ 4 \/ 64 * 64;/|test_single_copy|Pipeline.RanksAskingForDifferentStepsFollowTheCreator"
  "the own block's pipeline pieces all land at its start|src/algo/allgather.cpp|s/if \(off < mine\) sink\(me, off, call\.input \+ off,/if (off < mine) sink(me, 0, call.input + off,/|test_single_copy|Pipeline.OddStepsEveryByte"
  "streaming copy-out leaves the tail after the last whole line|src/algo/copy_in.cpp|s/  if \(i < len\) std::memcpy\(dst \+ i, src \+ i, len - i\);\n  _mm_sfence/  _mm_sfence/|test_algo|CopyOut.*"
  "a blocked wait does not drive the other groups' requests|src/core/group_impl.hpp|s/o\.others = others;/o.others = nullptr;/|test_engine|Requests.ProgressReachesTheOtherGroupsWhileBlocked"
  "the engine ignores the operation's deadline|src/engine/driver.cpp|s/if \(why\.ok\(\) && Clock::now\(\) > deadline_\)/if (false \&\& why.ok() \&\& Clock::now() > deadline_)/|test_engine|Deadline.*"
  "the engine ignores Communicator::abort()|src/engine/driver.cpp|s/opt_\.aborted->load\(std::memory_order_acquire\) != 0/false/|test_engine|Abort.FromAnotherThread*"
  "a broadcast hands members every block but the root's|src/algo/allgather.cpp|s/peer == call\.root\) take\(peer, off, src\)/peer != call.root) take(peer, off, src)/|test_broadcast|*BroadcastWorlds*"
  "a heap size from the store that is no number is used as zero|src/bootstrap/store_values.cpp|s/if \(!region\.ok\(\)\) return region\.status\(\);\n  h\.region = region\.value\(\);/h.region = region.ok() ? region.value() : 0;/|test_untrusted_store|UntrustedStore.AHeap*"
  "members connect over UCX before every member has taken the addresses|src/core/communicator.cpp|s/if \(auto ready = read\(fmt::format\(\"\{\}\/ucx\/\{\}\/read\", key_, ranks_\[m\]\)\); !ready\.ok\(\)\) return fail\(ready\.status\(\)\);//|test_untrusted_store|UntrustedStore.AnEmptyOrOutsizedWorkerAddressIsRefused"
  "a job on one server starts UCX too|src/core/communicator.cpp|s/  if \(config\.servers > 1\) \{\n    if \(Status s = start_network/  if (config.servers >= 1) {\n    if (Status s = start_network/|test_multinode|Ucx.OnlyJobsAcrossServersLoadIt"
  "FG_UCX_LIBRARY is ignored|src/transport/ucx_api.cpp|s/= base::env_text\(\"FG_UCX_LIBRARY\"\);/= std::nullopt;/|test_multinode|Ucx.ALibraryThatIsNotUcxFailsEveryRankWithTheReason"
  "a segment name from the store is opened unchecked|src/core/communicator.cpp|s/if \(Status s = bootstrap::check_segment_name\(local_key_ \+ \"\/name\", name\.value\(\), prefix_\); !s\.ok\(\)\) return fail\(s\);//|test_untrusted_store|UntrustedStore.ASegmentName*"
  "the spawner's token follows from the job id|src/launch/launch.cpp|s/p\.token = new_job_secret\(\);/p.token = \"spawner-\" + job;/|test_jobs|Spawner.ALocalStrangerCannotJoinOrStopAJob"
  "the store admits another local user who has the token|src/bootstrap/tcp_store.cpp|s/if \(st\.admission\.refuse_other_users && cl\.uid/if (false \&\& cl.uid/|test_tcp_store|TcpStore.AnotherLocalUserIsRefusedEvenWithTheToken"
  "the store admits HELLOs after every rank has joined|src/bootstrap/tcp_store.cpp|s/if \(st\.world >= 0 && static_cast<int>\(st\.ever_joined\.size\(\)\) >= st\.world\)/if (false)/|test_tcp_store|TcpStore.NobodyJoinsOnceTheJobIsComplete"
  "a stranger's HELLO is read without a bound|src/bootstrap/tcp_store.cpp|s/const size_t want = cl\.greeted \? sizeof\(buf\) : [^;]*;(.*?)if \(4 \+ static_cast<size_t>\(len\) > kMaxHello\)/const size_t want = sizeof(buf);\1if (false)/s|test_tcp_store|TcpStore.HalfSentHellosCostLittleMemory"
  "the store client gives up at its deadline without reading what arrived|src/bootstrap/tcp_store.cpp|s/if \(left <= 0 && !last_look\)/if (false)/|test_tcp_store|TcpStore.AReplyThatArrivedByTheDeadlineIsAnAnswer"
  "a member that fails building a group tells nobody|src/core/communicator.cpp|s/    if \(!heard_\) \{/    if (false) {/|test_faults|Groups/MemberCannotMap.*/0"
  "a server's whole last-level cache is counted for streaming stores|src/base/caches.cpp|s/std::min\(llc, kMostCountedLlcBytes\)/llc/|test_settings|Settings.StreamingStoresStartFromAQuarterOfAtMost128MiBOfCache"
  "Config::settings is ignored for the environment's|src/core/communicator.cpp|s/  if \(config\.settings\) \{/  if (false) {/|test_settings|Settings.ConfigSettingsWin*"
  "fg-bench's limits helper outlives the process that measures|tools/fg-bench/limits.cpp|s/::prctl\(PR_SET_PDEATHSIG, SIGKILL\);//; s/if \(is_parent_\) return ::getppid\(\) == pid_;/if (is_parent_) return true;/|test_bench|FgBench.KilledDuringItsLimitsMeasurementItLeavesNoProcess"
  "a long wait is not reported|src/engine/driver.cpp|s/if \(opt_\.policy\.report\.count\(\) > 0 && waited >= next_report_\) report\(waited\);//|test_faults|Stall.APeerStoppedForTenSecondsIsReportedNotFailed"
  "a one-server spawner without PORT takes the default port|src/launch/launch.cpp|s/if \(p\.servers == 1 && p\.master_port == 0\)/if (false)/|test_jobs|Spawner.TwoJobsWithoutAPortEachTakeAFreeOne"
  "abort() does not reach the group's shared memory (the signal-safe path)|src/core/communicator.cpp|s/if \(transport::ShmChannel\* ch = slot\.load\(std::memory_order_acquire\)\) ch->abort_now\(\);//|test_engine|Abort.FromASignalHandlerOutsideACallReachesThePeers"
  "test() alone never looks at the peers' health or the deadline|src/engine/driver.cpp|s/if \(!round\(Clock::now\(\) - wait_began_\)\) return false;/if (!round(Clock::duration::zero())) return false;/|test_engine|Requests.TestAloneNoticesADeadPeerAndTheDeadline"
  "the job's own ranks on the host are counted as a crowd|src/transport/wait_policy.cpp|s/return running > std::max\(cores, own_on_host\) \+ 1;/return running > cores + 1;/|test_waiting|Waiting.TheJobsOwnRanksAreNoCrowd"
  "the driver asks about the crowd without the job's ranks|src/engine/driver.cpp|s/const int own = opt_\.policy\.own_on_host;/const int own = 0;/|test_waiting|Waiting.TheJobsOwnRanksAreNoCrowd"
  "a group's waits count only its own members on the host|src/core/communicator.cpp|s/impl->policy\.own_on_host = own_on_host;/impl->policy.own_on_host = local_n_;/|test_waiting|Waiting.EveryGroupKnowsTheJobsRanksOnItsHost"
  "all_reduce never runs two-shot sooner where ranks outnumber cores|src/algo/plan.cpp|s/: g\.outnumbered \? kTwoShotMinBytesOutnumbered\n\s*: kTwoShotMinBytes;/: kTwoShotMinBytes;/|test_algo|Plan.AllReduceRunsTwoShotSoonerWhereRanksOutnumberCores"
  "a group's plans never see the ranks outnumbering the cores|src/core/communicator.cpp|s/transport::ranks_outnumber_cores\(impl->policy\.own_on_host\)\)/false)/|test_waiting|Waiting.EveryGroupKnowsTheJobsRanksOnItsHost"
  "an all_reduce of two members never runs two-shot|src/algo/plan.cpp|s/all_reduce && n >= 2 && call\.bytes >= two_shot_from/all_reduce \&\& n >= 3 \&\& call.bytes >= two_shot_from/|test_algo|Plan.AnAllReduceOfTwoMembersRunsTwoShotFrom128KiB"
  "two members run two-shot from the size for 3+|src/algo/plan.cpp|s/n == 2          \? kTwoShotMinBytesTwoMembers/n == 2 ? kTwoShotMinBytes/|test_algo|Plan.AnAllReduceOfTwoMembersRunsTwoShotFrom128KiB"
  "an all_reduce reads in place whatever the crowd|src/algo/plan.cpp|s/all_reduce && g\.outnumbered \? kInPlaceMinBytesAllReduceOutnumbered : kInPlaceMinBytes/kInPlaceMinBytes/|test_algo|Plan.AllReduceReadsInPlaceLaterWhereRanksOutnumberCores"
  "across servers the local phase follows the crowd's in-place rule|src/algo/plan.cpp|s/  server\.outnumbered = false;\n//|test_algo|Plan.AllReduceReadsInPlaceLaterWhereRanksOutnumberCores"
  "fg-bench's rewrite of a sum's input changes its values|tools/fg-bench/reduce_cases.cpp|s/b\[i\] = b\[i\];/b[i] = static_cast<unsigned char>(b[i] + 1);/|test_bench|FgBench.SumsWithInputsRewrittenStayExact"
  "a wait fails on its sender's exit though what it awaited had arrived|src/engine/driver.cpp|s/if \(!why\.ok\(\) && w\.ready\(\)\) return true;//|test_waiting|Waiting.WhatArrivedBeforeItsSenderLeftCounts"
  "calls do not consult the group's copy-in learner|src/ops/collectives.cpp|s/call\.copy_in = &impl_of\(group\)->copy_in;/call.copy_in = nullptr;/g|test_settings|CopyIn.TheGroupsLearnerDecidesHowEachCallCopiesIn"
  "the hierarchical relay's first step is not a full lockstep|src/algo/across.cpp|s/\.only_from = i == 0 \? -1 : kLeader/.only_from = kLeader/|test_multinode|Layouts/AcrossServers.*dp5:Layouts/AcrossServers.*dp6:Layouts/AcrossServers.*dp8"
  "step headers leave the protocol out|src/algo/plan.cpp|s/static_cast<unsigned>\(plan\.protocol\) << 6/0/|test_single_copy|SingleCopyFallback.RanksWhoseSettingsPlanDifferentProtocolsDisagree"
  "the plan offers single copy to an op that keeps no blocks|src/algo/plan.cpp|s/call\.root < 0 && call\.landing != nullptr &&\n/call.root < 0 \&\&\n/|test_algo|Plan.*"
  "the plan runs a ring of two members|src/algo/plan.cpp|s/topo\.members\(\) > 2 && call\.landing/topo.members() > 1 \&\& call.landing/|test_algo|Plan.*"
  "a member's refusal of single copy is not heard by the others|src/core/communicator.cpp|s/\*all = \*all && v\.value\(\);/*all = *all;/|test_single_copy|SingleCopyFallback.RefusedOnOneRankTheWholeGroupUsesTheRing"
  "a waiter on a crowded host spins and yields as on a quiet one|src/engine/driver.cpp|s/  spin_yield_ = spin_;/  (void)0;/|test_waiting|Waiting.OnACrowdedHostAWaiterSleepsAlmostAtOnce"
  "the host is never seen oversubscribed|src/transport/wait_policy.cpp|s/return running > std::max\(cores, own_on_host\) \+ 1;/return running > 4096;/|test_waiting|Waiting.TheHostIsSeenOversubscribedUnderLoad"
  "a reduce-scatter member sums the pieces meant for another|src/algo/reduce.cpp|s/ch\.bytes\(peer, ch\.last_step\(\), false, static_cast<size_t>\(me\) \* stride\)/ch.bytes(peer, ch.last_step(), false, static_cast<size_t>(peer) * stride)/|test_reduce|Ranks/ReduceWorlds.EveryDtypeAndSizeOrdinaryMemory/1"
  "the sum leaves out the last source|src/ops/sum.cpp|s/for \(int j = 2; j < n; \+\+j\)/for (int j = 2; j < n - 1; ++j)/g|test_reduce|Ranks/ReduceWorlds.EveryDtypeAndSizeOrdinaryMemory/1"
  "bf16 sums are truncated, not rounded|src/ops/sum.cpp|s/\(x \+ 0x7fffu \+ \(\(x >> 16\) & 1u\)\) >> 16/x >> 16/|test_reduce|Ranks/ReduceWorlds.EveryDtypeAndSizeOrdinaryMemory/0"
  "two-shot's shared sums lose their last byte|src/algo/reduce.cpp|s/len != 0 && dst != src\) copy_out\(dst, src, len, false\)/len != 0 \&\& dst != src) copy_out(dst, src, len - 1, false)/|test_reduce|Ranks/ReduceWorlds.AllReduceTwoShotAtEverySize/1"
  "an uneven gather reads every peer's block as long as its own|src/algo/allgather.cpp|s/const size_t b = call\.block\(member\);/const size_t b = call.block(me);/|test_gather_v|Ranks/UnevenWorlds.EveryBlockEveryByteOrdinaryMemory/1"
  "members' block sizes are left out of the header|src/ops/run_gather.hpp|s/call\.aux = hash;/call.aux = 0;/|test_gather_v|Uneven.MembersThatDisagreeOnTheSizesGetAMismatchAndTheGroupGoesOn"
  "the fused reduce-scatter multiplies its own chunk's rows for every member|src/ops/matmul_reduce_scatter.cpp|s/const size_t first = static_cast<size_t>\(member\) \* chunk_rows/const size_t first = static_cast<size_t>(group.rank()) * chunk_rows/|test_reduce|Ranks/MatmulReduceScatterWorlds.MatchesTheFloat64ReferenceBitForBit/1"
  "the fused reduce-scatter multiplies an x2 beyond L2 a piece at a time|src/ops/gemm.cpp|s/return x2 > l2 \/ 2 \S\S /return /|test_reduce|Ranks/MatmulReduceScatterWorlds.MatchesTheFloat64ReferenceBitForBit/1"
  "the fused reduce-scatter multiplies fewer than 64 rows a piece at a time|src/ops/gemm.cpp|s/\(dtype == DType::kF32 \S\S m < kWholeBelowRows\)/false/|test_reduce|Ranks/MatmulReduceScatterWorlds.MatchesTheFloat64ReferenceBitForBit/1"
  "the fused reduce-scatter multiplies every product at once|src/ops/gemm.cpp|s/return x2 > l2 \/ 2 \S\S [^;]*;/return true;/|test_reduce|Ranks/MatmulReduceScatterWorlds.MatchesTheFloat64ReferenceBitForBit/1"
  "the fused reduce-scatter multiplies bf16 and fp16 at once too|src/ops/gemm.cpp|s/\(dtype == DType::kF32 \S\S m < kWholeBelowRows\)/(m < kWholeBelowRows)/|test_reduce|Ranks/MatmulReduceScatterWorlds.MatchesTheFloat64ReferenceBitForBit/1"
  "one GEMM call converts any number of bf16 rows of x1 whole|src/ops/gemm.cpp|s/if \(dtype != DType::kF32 && m \* k \* sizeof\(float\) > kWholeMaxBytes\) return false;//|test_reduce|MatmulReduceScatter.OneCallHoldsAtMost64MiBWhole"
  "across servers the whole product's pieces are copied from the first member's chunk|src/ops/matmul_reduce_scatter.cpp|s/std::memcpy\(dst, product \+ first, len\)/std::memcpy(dst, product + offset, len)/|test_reduce|MatmulReduceScatter.AcrossServersMatchesTheReferenceBitForBit"
  "across servers every member sums the first chunk|src/ops/reductions.cpp|s/static_cast<size_t>\(group\.rank\(\)\) \* \(bytes \/ n\)/0/|test_reduce|Reduce.AcrossServersOneShotGathersTheInputs"
  "across servers auto gathers the inputs instead of the hierarchical sum|src/algo/plan.cpp|s/if \(hierarchical && same_members_per_server\(g\.topo\)\) return plan_sum_across\(g, call\);//|test_reduce|Reduce.AcrossServersHierarchicalEveryDtypeAndSize"
  "a message between servers is taken whatever call its header names|src/algo/across.cpp|s/if \(has_header && m\.header\.same_call\(mine_\) && /if (has_header \&\& /|test_reductions|Reductions.DisagreementAcrossServersIsFoundInTheExchange"
  "gather, scatter and all_to_all copy one byte short of each part they take|src/ops/collectives.cpp|s/if \(d != s\) algo::copy_out\(d, s, to - from, stream_out\);/if (d != s) algo::copy_out(d, s, to - from - 1, stream_out);/|test_exchanges|Ranks/Exchanges.EveryByteOrdinaryMemory/0"
  "an uneven all_to_all takes its part of each block one member later|src/ops/collectives.cpp|s/if \(j < me\) before \+= /if (j <= me) before += /|test_exchanges|Ranks/Exchanges.EveryByteOrdinaryMemory/1"
  "all_to_all runs with counts that do not pair up|src/ops/collectives.cpp|s/if \(splits\.send\(m, j\) != splits\.recv\(j, m\)\)/if (false)/|test_exchanges|Exchanges.DisagreementsAreFoundOnEveryMemberAndTheGroupGoesOn"
  "gather's header leaves the root out|src/ops/collectives.cpp|s/static_cast<uint64_t>\(root\), across \? &part_ref : nullptr\);/0, across ? \&part_ref : nullptr);/|test_exchanges|Exchanges.DisagreementsAreFoundOnEveryMemberAndTheGroupGoesOn"
  "across servers a scatter sends every member the root's first chunk|src/ops/collectives.cpp|s/auto chunk = \[&\]\(int reader\) \{ return \(\*from\)\(reader\); \};/auto chunk = [\&](int reader) { return (*from)(0 * reader); };/|test_exchanges|Exchanges.AcrossServersEveryByte"
  "across servers an uneven all_to_all sends each member the next one's split|src/ops/collectives.cpp|s/for \(size_t j = 0; j < r; \+\+j\) before \+=/for (size_t j = 0; j <= r; ++j) before +=/|test_exchanges|Exchanges.AcrossServersEveryByte"
  "across servers a member on another server is sent the whole block, not its part|src/algo/across.cpp|s/const Part out = part\(me\(\), m\);/const Part out{0, pieces(me())};/|test_exchanges|Exchanges.AcrossServersEachMemberIsSentOnlyItsPart"
  "a schedule names the shared-memory channel|src/algo/reduce.cpp|s/#include \x22transport\/shm_heap\.hpp\x22/#include \x22transport\/shm_heap.hpp\x22\n#include \x22transport\/shm_channel.hpp\x22/|test_layers|Layers.NothingInAlgoIncludesUpward"
  "all_gather into a list lets a peer's block land on the input|src/ops/collectives.cpp|s/if \(!\(own && o\.data == input\.data\) && ops::overlaps/if (o.data != input.data \&\& ops::overlaps/|test_exchanges|Exchanges.BadArgumentsAreRefused"
  "a scatter within a server takes the first member's piece, not the root's|src/ops/collectives.cpp|s/const std::byte\* src = srcs\[root - first\];/const std::byte* src = srcs[0];/|test_exchanges|Ranks/Exchanges.EveryByteOrdinaryMemory/0"
  "a timeout is said without the words torch looks for|src/engine/driver.cpp|s/\x22Timed out waiting: \x22 \+ t\.message\(\)/t.message()/|test_faults|Stall.SlowRankIsNoErrorMissingRankTimesOut"
  "the hierarchical reduce-scatter's slabs are the chunks as they lie|src/algo/across.cpp|s/const size_t member = t \* locals \+ static_cast<size_t>\(d\);/const size_t member = static_cast<size_t>(d) * static_cast<size_t>(layout_.servers) + t;/|test_reduce|Reduce.AcrossServersHierarchicalEveryDtypeAndSize"
  "every server is sent the partial sums of the first chunk|src/algo/call.hpp|s/return scatter \? static_cast<size_t>\(t\) \* chunk : 0;/return 0;/|test_reduce|Reduce.AcrossServersHierarchicalEveryDtypeAndSize"
  "the servers' partial sums are added in reverse server order|src/algo/across.cpp|s/(\s*)sums_\.of_partials\(result_at/\1std::reverse(srcs.data(), srcs.data() + S);\1sums_.of_partials(result_at/|test_reduce|Reduce.AcrossServersThreeServersOfTwoRanks"
  "fp16 and bf16 partial sums are rounded before the exchange|src/ops/sum.cpp|s/  return half\(dtype\) && \(op == ReduceOp::kSum/  return false \&\& (op == ReduceOp::kSum/|test_reduce|Reduce.AcrossServersHierarchicalEveryDtypeAndSize"
  "a hierarchical all_reduce does not share the summed slabs within the server|src/algo/across.cpp|s/if \(!scatter_ && !layout_\.whole && layout_\.locals > 1\)/if (false)/|test_reduce|Reduce.AcrossServersHierarchicalFromTheHeap"
  "across servers the fused op makes every slab from its own server's member's rows|src/algo/across.cpp|s/\(\*sums_\.produce\)\(static_cast<int>\(member\), within/(*sums_.produce)(d, within/|test_reduce|MatmulReduceScatter.AcrossServersMatchesTheReferenceBitForBit"
  "with one rank a server the fused op makes the first chunk for every server|src/algo/across.cpp|s/\(\*sums_\.produce\)\(t, at,/(*sums_.produce)(0, at,/|test_reduce|MatmulReduceScatter.AcrossServersMatchesTheReferenceBitForBit"
  "across servers the local phase of an uneven all-gather reads the first server's sizes|src/algo/across.cpp|s/      c\.sizes \+= base;[^\n]*\n//|test_gather_v|Uneven.AcrossServersEveryBlockEveryByte"
  "the relay's members expect as many steps from every block as from the largest|src/algo/across.cpp|s/steps \+= \(of\.length\(p\) \+ chunk - 1\) \/ chunk;/steps += (std::min(plan_.net_piece, call_.bytes - std::min(call_.bytes, of.offset(p))) + chunk - 1) \/ chunk;/|test_gather_v|Uneven.AcrossServersEveryBlockEveryByte"
  "a small all_reduce in place across servers lets peers read the input it overwrites|src/algo/across.cpp|s/sum_everything\(st, out_, sum_ref\)/sum_everything(st, partials, sum_ref)/|test_reduce|Reduce.AcrossServersHierarchicalFromTheHeap"
  "one rank a server runs the exchange, not the schedules of one server over the steps|src/algo/plan.cpp|s/g\.steps\.max_step_bytes == 0\) return false;/g.steps.max_step_bytes == 0 \x7c\x7c true) return false;/|test_multinode|OneRankEachServer.*"
  "over the network each peer is sent a reduce-scatter step whole, not its piece|src/transport/net_steps.cpp|s/from = std::min\(readers\.start\(p\), len\);/from = 0;/|test_reduce|Reduce.AcrossServersOneRankEachServer"
  "over the network a ring step's bytes go to the peers that do not read them|src/transport/net_steps.cpp|s/readers\.only >= 0 && p != readers\.only/readers.only >= 0 \&\& p == readers.only/|test_multinode|OneRankEachServer.*"
  "members cut the steps between servers by their own FG_NET_PIECE_BYTES, not rank 0's|src/core/communicator.cpp|s/        step_text = got\.value\(\);\n//|test_multinode|OneRankEachServer.*"
  "received in place, every piece of a peer's block lands at the block's start|src/algo/allgather.cpp|s/return \*room != 0 \? \(\*call\.landing\)\(of\) \+ off : nullptr;/return *room != 0 ? (*call.landing)(of) : nullptr;/|test_multinode|OneRankEachServer.*"
  "received in place, a peer's summed chunk lands where this member's goes|src/algo/reduce.cpp|s/return out \+ chunks\.first\(peer\) \+ off;/return out + chunks.first(me) + off;/|test_reduce|Reduce.AcrossServersOneRankEachServer"
  "over the network a reduce-scatter sent from where its input lies sends every peer the whole of it|src/algo/reduce.cpp|s/step\.readers = \{\.each = chunks\.each, \.base = off, \.length = stride\};/step.readers = {};/|test_reduce|Reduce.AcrossServersOneRankEachServer"
  "a member that received a larger message says only that|src/ops/run_gather.hpp|s/  co_return explain_across\(i, std::move\(s\), was_broken, st\.headers_compared\);/  co_return s;/|test_reduce|Reduce.AcrossServersAMismatchIsNamedOnEveryMember"
  "convert treats empty views like any other|src/ops/convert.cpp|s/  if \(n == 0\) return Status::Ok\(\);[^\n]*\n//|test_tensor|Convert.EmptyViewsWithoutMemoryAreFineAndNullOnesWithElementsRefused"
  "Tensor::allocate calls a bad shape a lack of memory|src/core/tensor.cpp|s/return Status\{ErrorKind::kInvalidArgument, checked\.status\(\)\.message\(\)\};/return Status{ErrorKind::kResourceExhausted, checked.status().message()};/|test_jobs|Environment.TensorAllocateReturnsTheErrorAsAStatus"
  "a wait for a peer on the same CPU spins first all the same|src/engine/driver.cpp|s/if \(opt_\.policy\.adapt && w->comes_from_cpu\(::sched_getcpu\(\)\)\)/if (false)/|test_waiting|Waiting.AWaitForAPeerOnTheSameCpuSkipsTheSpin"
  "a post does not say which CPU it came from|src/transport/shm_channel.cpp|s/ctl\(me_\)\.wake\.cpu\.store\(cpu, std::memory_order_relaxed\);//|test_shm_channel|ShmChannel.APostSaysWhichCpuItCameFrom"
  "a member waits for the peers on its CPU in turn with the others|src/algo/allgather.cpp|s/if \(my_cpu >= 0 && cpu_of\(peer\) == my_cpu\) out\[k\+\+\] = peer;//|test_algo|PeerOrder.*"
  "fg-bench counts every iteration evenly placed|tools/fg-bench/host.cpp|s/if \(n > fair\) return false;//|test_bench|Placement.*:FgBench.RanksHeldOnOneCpuAreReportedUnevenlyPlaced"
  "fg-bench never waits for an even placement|tools/fg-bench/runner.cpp|s/const bool more = std::find\(even\.begin\(\), even\.end\(\), false\) != even\.end\(\) && us_since\(t0\) < most_us;/const bool more = false;/|test_bench|FgBench.RanksHeldOnOneCpuAreReportedUnevenlyPlaced"
  "fg-bench's trials start without waiting for an even placement|tools/fg-bench/runner.cpp|s/auto settled = settle\(c, p\.it\);\n  if \(!settled\.ok\(\)\) return settled\.status\(\);\n  p\.settle_us \+= settled\.value\(\);//|test_bench|FgBench.RanksHeldOnOneCpuAreReportedUnevenlyPlaced"
  "the progress thread runs completion callbacks itself|src/engine/progress.cpp|s/for \(auto& f : ready\) completions\.post\(std::move\(f\)\);/for (auto\& f : ready) f();/|test_engine|Progress.ACallbackStartsARequestAndWaitsForItsCompletion"
  "one completion thread runs every callback in turn|src/engine/progress.cpp|s/if \(static_cast<int>\(st_->work\.size\(\)\) > st_->idle && st_->threads < kMaxThreads\)/if (st_->threads < 1)/|test_engine|Progress.ACallbackStartsARequestAndWaitsForItsCompletion"
  "a callback asked for after finalize() runs on the caller|src/engine/progress.cpp|s/std::thread\(\[fn = std::move\(fn\)\]\(\) mutable \{ run_guarded\(fn\); \}\)\.detach\(\);/run_guarded(fn);/|test_engine|Progress.ACallbackAskedForAfterTheCommunicatorIsGoneRunsOnAThreadOfItsOwn"
  "the progress thread never drives a request its owner left|src/engine/progress.cpp|s/const bool drove = q->lend_a_hand\(\*op, Clock::now\(\) \+ kSlice\);/const bool drove = false;/|test_engine|Progress.DrivesARequestItsOwnerLeft"
  "max reduces as min|src/ops/sum.cpp|s/case ReduceOp::kMax: return \(a > b /case ReduceOp::kMax: return (a < b /|test_reductions|Reductions.EveryReductionEveryDtypeWithinAServer"
  "a bool sum adds instead of or-ing|src/ops/sum.cpp|s/case ReduceOp::kSum: case ReduceOp::kMax: return ReduceOp::kBor;/case ReduceOp::kMax: return ReduceOp::kBor;/|test_reductions|Reductions.EveryReductionEveryDtypeWithinAServer"
  "across servers each server's partial average is divided too|src/ops/sum.cpp|s/  if \(op == ReduceOp::kAvg\) r\.op = ReduceOp::kSum;  \/\/ divided once, at the end\n//|test_reductions|Reductions.EveryReductionEveryDtypeAcrossServers"
  "an average multiplies by the inverse of any group size|src/ops/sum.cpp|s/  if \(std::has_single_bit\(static_cast<unsigned>\(members\)\)\) d\.inverse/  d.inverse/|test_reductions|Reductions.EveryReductionEveryDtypeWithinAServer"
  "an average of a power-of-two group is not divided|src/ops/sum.cpp|s/o\[i\] = acc\[i\] \* d\.inverse;/o[i] = acc[i];/|test_reductions|Reductions.EveryReductionEveryDtypeWithinAServer"
  "a reduction but the sum skips its third source on|src/ops/sum.cpp|s/for \(int j = 2; j < n; \+\+j\) \{\n      const T\* c = as<T>\(s\[j\]\) \+ at;\n      for \(size_t i = 0; i < m; \+\+i\) acc\[i\] = combine/for (int j = 2; j < 2; ++j) {\n      const T* c = as<T>(s[j]) + at;\n      for (size_t i = 0; i < m; ++i) acc[i] = combine/|test_reductions|Reductions.EveryReductionEveryDtypeWithinAServer"
  "the reduction is left out of the call's header|src/ops/reductions.cpp|s/call\.aux = static_cast<uint64_t>\(options\.op\);/call.aux = 0;/|test_reductions|Reductions.DisagreementIsAMismatchAndUnservedReductionsAreRefused"
  "a mismatch names the peers in the order the waits took them|src/algo/allgather.cpp|s/std::sort\(differ\.begin\(\), differ\.end\(\)\);//|test_faults|Mismatch.TheFirstDisagreeingPeerDoesNotDependOnWhereRanksRun"
)

# The AVX-512 kernel's mutants need a CPU that runs it.
if ! grep -qw avx512f /proc/cpuinfo; then
  kept=()
  for m in "${MUTATIONS[@]}"; do [[ "${m%%|*}" == *AVX-512* ]] || kept+=("$m"); done
  echo "(no AVX-512 on this CPU: $(( ${#MUTATIONS[@]} - ${#kept[@]} )) mutations of its kernel not run)"
  MUTATIONS=("${kept[@]}")
fi
if [ -n "${FG_MUTATIONS_ONLY:-}" ]; then
  kept=()
  for m in "${MUTATIONS[@]}"; do [[ "${m%%|*}" =~ $FG_MUTATIONS_ONLY ]] && kept+=("$m"); done
  MUTATIONS=("${kept[@]}")
  PY_MUTATIONS_SKIP=1
fi
# Mutations of one file run one after another: the file put back after a
# mutation is compiled again only when the next one mutates another file.
if [ "${#MUTATIONS[@]}" -gt 0 ]; then
  mapfile -t MUTATIONS < <(printf '%s\n' "${MUTATIONS[@]}" | sort -s -t'|' -k2,2)
fi
build() { cmake --build "$WORK/build" -j"$(nproc)" --target "$1" >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; return 1; }; }
caught=0 missed=0
# The unmutated tree passes every one of these tests first (each test and filter
# once), unless the caller has just passed them all on this tree and says where in
# FG_MUTATIONS_UNMUTATED_PASSED (any non-empty text; scripts/run.sh test: its ctest
# runs at -O2 and, under ASan+UBSan, at -O1, the level these mutants are built at).
if [ -n "${FG_MUTATIONS_UNMUTATED_PASSED:-}" ]; then
  echo "unmutated: passed in the caller's ctest runs ($FG_MUTATIONS_UNMUTATED_PASSED)"
else
  declare -A passed_unmutated=()
  for m in "${MUTATIONS[@]}"; do
    IFS='|' read -r name file subst target filter <<<"$m"
    [ -z "${passed_unmutated["$target|$filter"]:-}" ] || continue
    passed_unmutated["$target|$filter"]=1
    build "$target"
    "$WORK/build/tests/$target" --gtest_filter="$filter" >"$WORK/run.log" 2>&1 || { echo "FAILED: $target $filter fails unmutated"; tail -30 "$WORK/run.log"; exit 1; }
  done
  echo "unmutated: ${#passed_unmutated[@]} tests built and passed in $SECONDS s"
fi
for m in "${MUTATIONS[@]}"; do
  IFS='|' read -r name file subst target filter <<<"$m"
  cp "$ROOT/$file" "$WORK/$file"
  perl -0pi -e "$subst" "$WORK/$file"
  if cmp -s "$ROOT/$file" "$WORK/$file"; then
    echo "FAILED: mutation '$name' no longer applies to $file (update tests/mutations/run.sh)"; missed=$((missed + 1)); continue
  fi
  t0=$SECONDS
  build "$target"
  t1=$SECONDS
  # The first failure is enough: the rest of the filter would only add its timeouts.
  if timeout 300 "$WORK/build/tests/$target" --gtest_filter="$filter" --gtest_fail_fast >"$WORK/run.log" 2>&1; then
    echo "FAILED: '$name' ($file) is not caught by $target $filter"; missed=$((missed + 1))
  else
    echo "ok: '$name' is caught by $target $filter (build $((t1 - t0)) s, test $((SECONDS - t1)) s)"; caught=$((caught + 1))
  fi
  cp "$ROOT/$file" "$WORK/$file"
done

# The torch backend (python/): the same, with a pytest node for a test. The
# build above is reconfigured with the Python package (the library is not
# rebuilt); skipped with a word where no interpreter imports torch.
# name | file | perl substitution | pytest node (tests/python/...)
PY_MUTATIONS=(
  "a sparse all_reduce keeps this rank's entries|python/csrc/reductions.cpp|s/t\.copy_\(at::sparse_coo_tensor\(at::cat\(parts, 1\), val_all, t\.sizes\(\)\)\.coalesce\(\)\);/t.copy_(t.coalesce());/|test_torch_backend.py::test_coalesced_and_functional_collectives[2]"
  "a receive from any source says rank 0 sent it|python/csrc/work.cpp|s/  return flight_->source;/  return 0;/|test_torch_backend.py::test_send_recv_any_source_batch_and_objects_match_expected_and_gloo[3]"
  "the library's progress thread never drives a work its owner left waiting|src/engine/progress.cpp|s/const bool drove = q->lend_a_hand\(\*op, Clock::now\(\) \+ kSlice\);/const bool drove = false;/|test_torch_backend.py::test_async_work_moves_while_python_computes"
  "a work is not handed to the library's progress thread|python/csrc/work.cpp|s/flight_->requests\.back\(\)\.drive_in_background\(\);//|test_torch_backend.py::test_async_work_moves_while_python_computes"
  "a blocking call through torch is handed to the library's progress thread|python/csrc/backend.cpp|s/  work->submitted\(async_op\);/  work->submitted(true);/|test_torch_backend.py::test_blocking_calls_run_on_the_callers_thread[2]"
  "Future callbacks run on the library's progress thread|src/engine/progress.cpp|s/for \(auto& f : ready\) completions\.post\(std::move\(f\)\);/for (auto\& f : ready) f();/|test_torch_backend.py::test_future_callbacks_that_run_collectives_finish"
  "reduce_scatter_tensor_coalesced starts its first pair alone|python/csrc/reductions.cpp|s/for \(size_t i = 0; i < inputs\.size\(\); \+\+i\) \{\n    add_reduce_scatter/for (size_t i = 0; i < 1; ++i) {\n    add_reduce_scatter/|test_torch_backend.py::test_coalesced_and_functional_collectives"
  "all_to_all_single takes uneven splits for equal ones|python/csrc/exchanges.cpp|s/if \(!input_splits\.empty\(\) \x7c\x7c !output_splits\.empty\(\)\) \{/if (false) {/|test_torch_backend.py::test_gather_scatter_all_to_all_and_reduce_match_expected_and_gloo[2]"
  "the backend's sequence number never advances|python/csrc/backend.cpp|s/  seq_\.fetch_add\(1, std::memory_order_relaxed\);\n//|test_torch_backend.py::test_gather_scatter_all_to_all_and_reduce_match_expected_and_gloo[2]"
  "an in-place direct operator leaves a strided tensor as it was|python/csrc/direct_ops.cpp|s/    if \(!buf\.is_same\(user\)\) user\.copy_\(buf\);\n//|test_torch_backend.py::test_direct_operators_match_dist_and_gloo_and_compile[2-1-2]"
  "the in-place all_reduce_ has no fake kernel|python/fastgather/__init__.py|s/\@torch\.library\.register_fake\(\x22fastgather::all_reduce_\x22\)\n//|test_torch_backend.py::test_direct_operators_match_dist_and_gloo_and_compile[2-1-2]"
  "another torch release than the one built against is let through|python/fastgather/__init__.py|s/^if torch\.__version__\.split\(\x22\+\x22\)\[0\] != _BUILT_WITH\.split\(\x22\+\x22\)\[0\]:/if False:/m|test_torch_backend.py::test_a_torch_other_than_the_one_built_against_is_named"
  "Work.wait(timeout) waits as if it had no timeout|python/csrc/work.cpp|s/const bool forever = timeout == kNoTimeout;/const bool forever = true;/|test_torch_backend.py::test_wait_timeout_exception_and_future"
)
PY="$ROOT/.venv/bin/python"
if [ -n "${PY_MUTATIONS_SKIP:-}" ]; then
  echo "(torch backend mutations not run: FG_MUTATIONS_ONLY)"
elif [ -x "$PY" ] && "$PY" -c "import torch" 2>/dev/null; then
  cmake -S "$WORK" -B "$WORK/build" -DFG_WITH_TORCH=ON -DFG_PYTHON="$PY" >/dev/null
  pyrun() { (cd "$WORK" && PYTHONPATH="$WORK/build/python" timeout 600 "$PY" -m pytest -q -x -p no:cacheprovider "tests/python/$1") >"$WORK/run.log" 2>&1; }
  for m in "${PY_MUTATIONS[@]}"; do
    IFS='|' read -r name file subst node <<<"$m"
    build fastgather_torch
    pyrun "$node" || { echo "FAILED: $node fails unmutated"; tail -30 "$WORK/run.log"; exit 1; }
  done
  for m in "${PY_MUTATIONS[@]}"; do
    IFS='|' read -r name file subst node <<<"$m"
    cp "$ROOT/$file" "$WORK/$file"
    perl -0pi -e "$subst" "$WORK/$file"
    if cmp -s "$ROOT/$file" "$WORK/$file"; then
      echo "FAILED: mutation '$name' no longer applies to $file (update tests/mutations/run.sh)"; missed=$((missed + 1)); continue
    fi
    build fastgather_torch
    if pyrun "$node"; then
      echo "FAILED: '$name' ($file) is not caught by $node"; missed=$((missed + 1))
    else
      echo "ok: '$name' is caught by $node"; caught=$((caught + 1))
    fi
    cp "$ROOT/$file" "$WORK/$file"
  done
else
  echo "FAILED: no interpreter with torch at $PY for the torch backend's mutations"; missed=$((missed + 1))
fi
echo "mutations: $caught passed, $missed failed"
[ "$missed" = 0 ]
