// Unpacks a qemu_q golden hex file the way an RTL testbench would, and prints its elements.
//
// The file holds a tensor's ONNX raw_data byte stream in little-endian words, one word per
// line, read here with $readmemh (the `//` header lines are comments to it). Element i
// occupies stream bits [i*BITS +: BITS]; stream bit b is bit b % WORD of word b / WORD.
// That one rule covers every packing: whole bytes, two int4 / uint4 / float4 per byte
// (element 0 in the low nibble), four int2 / uint2 per byte (element 0 in bits 1:0), and
// the float6 LSB-first bit stream, whose elements may straddle words.
//
// Plusargs:
//   +hex=FILE      the hex file
//   +word=N        word width of the file: 8, 16, 32 or 64
//   +bits=N        bits per element: 2, 4, 6, 8, 16, 32 or 64
//   +count=N       number of elements
//   +signed=0|1    sign-extend elements (the signed integer types)
// Output: one line "E <value>" per element, in decimal; signed elements as signed values,
// others as the unsigned value of their bits (a float's bit pattern).
//
//   iverilog -g2005 -o unpack_tb.vvp unpack_tb.v
//   vvp -N unpack_tb.vvp +hex=input_0.hex +word=32 +bits=4 +count=87 +signed=1

module unpack_tb;
  localparam MAX_WORDS = 1 << 20;

  reg [63:0] mem [0:MAX_WORDS-1];
  reg [8*4096-1:0] path;
  integer word_bits, bits, count, is_signed;
  integer i, j, stream_bit, n_words;
  reg [63:0] value;

  initial begin
    if (!$value$plusargs("hex=%s", path)) begin
      $display("ERROR missing +hex=FILE");
      $finish;
    end
    if (!$value$plusargs("word=%d", word_bits)) word_bits = 32;
    if (!$value$plusargs("bits=%d", bits)) bits = 8;
    if (!$value$plusargs("count=%d", count)) count = 0;
    if (!$value$plusargs("signed=%d", is_signed)) is_signed = 0;
    if (word_bits != 8 && word_bits != 16 && word_bits != 32 && word_bits != 64) begin
      $display("ERROR word width %0d", word_bits);
      $finish;
    end
    if (count * bits > MAX_WORDS * word_bits) begin
      $display("ERROR %0d elements do not fit MAX_WORDS", count);
      $finish;
    end

    // ceil(count * bits / 8) bytes in ceil(bytes / word bytes) words
    n_words = ((count * bits + 7) / 8 + word_bits / 8 - 1) / (word_bits / 8);
    if (n_words > 0)
      $readmemh(path, mem, 0, n_words - 1);

    for (i = 0; i < count; i = i + 1) begin
      value = 64'd0;
      for (j = 0; j < bits; j = j + 1) begin
        stream_bit = i * bits + j;
        value[j] = mem[stream_bit / word_bits][stream_bit % word_bits];
      end
      if (is_signed != 0 && bits < 64 && value[bits - 1])
        value = value | (64'hFFFFFFFFFFFFFFFF << bits);
      if (is_signed != 0)
        $display("E %0d", $signed(value));
      else
        $display("E %0d", value);
    end
    $finish;
  end
endmodule
