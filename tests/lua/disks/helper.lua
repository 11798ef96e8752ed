-- Shared by the disks suite: backing images and the backend probe.
local M = {}

-- A fresh image file of `bytes` bytes, each byte `fill` (default NUL).
-- Provium never creates images: the test does, as the reference says.
function M.image(bytes, fill)
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(string.rep(fill or "\0", bytes))
  f:close()
  return path
end

-- The bytes of `path` (to check what a host-side op did to the file).
function M.slurp(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- Whether this run's backend has disks. Only kvm does: on local,
-- vm:attach_disk refuses (a sandbox has no block devices). Nothing boots:
-- the probe VM stays `created`.
function M.probe()
  local ok, err = pcall(function()
    provium:vm("disk-probe", "linux"):attach_disk({id = "probe"})
  end)
  return ok, err
end

M.NO_DISKS = "the local backend has no block devices; this suite's disk tests run with --vmm kvm"

return M
