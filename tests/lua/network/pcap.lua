-- Classic pcap parsing for the network suites (a helper module, loaded with
-- require("network.pcap"); not a test file). Written independently of the
-- switch's encoder so the suites check its bytes rather than trust them.

local M = {}

local function check(cond, msg)
  if not cond then error("pcap: " .. msg, 3) end
end

-- The frames of a classic little-endian pcap stream (what bridge:capture()
-- and nic:capture() produce), in order. Raises an error that names the first
-- malformed field: header, record timestamps, lengths, truncation, trailing
-- bytes.
function M.frames(pcap)
  check(#pcap >= 24, "shorter than its global header (" .. #pcap .. " bytes)")
  local magic, major, minor, _, _, snaplen, linktype = string.unpack("<I4 I2 I2 i4 I4 I4 I4", pcap)
  check(magic == 0xa1b2c3d4, string.format("magic %#x, not 0xa1b2c3d4", magic))
  check(major == 2 and minor == 4, "version " .. major .. "." .. minor .. ", not 2.4")
  check(snaplen == 65535, "snaplen " .. snaplen .. ", not 65535")
  check(linktype == 1, "link type " .. linktype .. ", not 1 (ethernet)")
  local frames, pos = {}, 25
  while pos + 16 <= #pcap + 1 do
    local _, usec, incl, orig = string.unpack("<I4 I4 I4 I4", pcap, pos)
    check(usec < 1000000, "record " .. (#frames + 1) .. ": usec " .. usec)
    check(incl <= orig, "record " .. (#frames + 1) .. ": incl_len > orig_len")
    local frame = pcap:sub(pos + 16, pos + 15 + incl)
    check(#frame == incl, "record " .. (#frames + 1) .. " is truncated")
    frames[#frames + 1] = frame
    pos = pos + 16 + incl
  end
  check(pos == #pcap + 1, "trailing bytes after the last record")
  return frames
end

-- For an IPv4 ICMP echo request or reply: its ICMP type (8 request, 0 reply)
-- and sequence number; nil for any other frame.
function M.icmp_echo(frame)
  if #frame < 14 + 20 + 8 or string.unpack(">I2", frame, 13) ~= 0x0800 then return nil end
  if frame:byte(14 + 10) ~= 1 then return nil end -- IPv4 protocol 1: ICMP
  local ihl = (frame:byte(15) & 0x0f) * 4
  if #frame < 14 + ihl + 8 then return nil end
  local icmp_type = frame:byte(14 + ihl + 1)
  if icmp_type ~= 8 and icmp_type ~= 0 then return nil end
  return icmp_type, string.unpack(">I2", frame, 14 + ihl + 7)
end

return M
